"""A launch inside a Slurm job takes what Slurm already says (the job, the step's nodes, this
node) for the keys the user did not set (docs/multinode.md, "Under Slurm").

hostlist  Slurm's compressed host lists expanded (``n[1-3,7]``), pure
job       the Slurm variables read and checked against each other, pure
fill      the overrides a command takes from them, and the lines that say so
"""
