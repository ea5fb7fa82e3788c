"""A tiny stand-in for an inference server, started by the server-control tests as a real process.

`GET /health` answers 503 until --healthy-after-s has passed (never with a negative value), then 200;
`GET /setting` answers the --setting it was started with. Before serving it prints --lines lines;
--exit-code N exits with N at once instead; --child starts a grandchild in its group (vLLM's engine) and
writes its PID to --child-pid-file; --ignore-term ignores SIGTERM (only SIGKILL ends it).
"""

from __future__ import annotations

import argparse
import http.server
import os
import signal
import subprocess
import sys
import time


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--setting", default="")
    parser.add_argument("--healthy-after-s", type=float, default=0.0)
    parser.add_argument("--exit-code", type=int, default=None)
    parser.add_argument("--lines", type=int, default=3)
    parser.add_argument("--child-pid-file", default="")
    parser.add_argument("--ignore-term", action="store_true")
    args = parser.parse_args()
    for i in range(args.lines):
        print(f"fake server line {i} setting={args.setting}", flush=True)
    if args.exit_code is not None:
        print(f"fake server: exiting with {args.exit_code}", file=sys.stderr, flush=True)
        return args.exit_code
    if args.ignore_term:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if args.child_pid_file:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        with open(args.child_pid_file, "w") as out:
            out.write(str(child.pid))
    started = time.monotonic()

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, format: str, *a: object) -> None:  # noqa: A002
            pass

        def do_GET(self) -> None:
            healthy = args.healthy_after_s >= 0 and time.monotonic() - started >= args.healthy_after_s
            status, body = 404, b"no"
            if self.path == "/health":
                status, body = (200, b"ok") if healthy else (503, b"loading")
            elif self.path == "/setting":
                status, body = 200, args.setting.encode()
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = http.server.HTTPServer(("127.0.0.1", args.port), Handler)
    print(f"fake server pid {os.getpid()} on {args.port}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
