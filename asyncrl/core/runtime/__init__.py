"""How every process lives and ends: errors, deadlines, children, the run directory.

fatal     errors a restart cannot fix, and how a role tells its launcher
waiting   waits that say what they wait for, have a deadline and stop on request
lifeline  children die with their parent; stacks on ``kill -USR1``
rundir    the run directory: created, checked writable, locked by one job
torchrun  TCPStore servers that listen on one address
heap      the start-up heap out of the garbage collector's way
faults    failpoints for the fault-injection tests (inert unless set)
specs     user code named by a spec (``module:name`` or ``file.py:name``), never eval-ed
"""
