"""The private ``redis-server`` of one run: started, configured, secured.

server  ``RedisServer``: loopback or ``host``, password, ACL users, AOF, no eviction
files   what it writes into the run directory (pure)
tls     the TLS files for ``buffer.tls_dir``, made when missing
"""
