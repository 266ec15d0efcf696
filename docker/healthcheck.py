"""A container health check: GET a daemon's /healthz; exit 0 when it answers 200 (SERVING), else 1.

Standard library only, so a probe every few seconds costs a Python start
(about 20 ms of CPU), not an import of flightpart, pyarrow and gRPC.
"""

import sys
import urllib.error
import urllib.request

url = sys.argv[1] if len(sys.argv) > 1 else "http://127.0.0.1:8818/healthz"
try:
    with urllib.request.urlopen(url, timeout=3) as reply:
        sys.exit(0 if reply.status == 200 else 1)
except urllib.error.HTTPError as exc:
    print(exc.read().decode(errors="replace")[:500])
    sys.exit(1)
except OSError as exc:
    print(f"unreachable: {exc}")
    sys.exit(1)
