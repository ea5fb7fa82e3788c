"""Secrets stay out of the run folder, and the server's words cannot script the report.

One real run against a scripted server that sometimes answers 500 with a `<script>` body, with an
Authorization header (HEADERS) and a GPU sidecar that demands a token (--gpu-token):
- the header reaches the server and the token reaches the sidecar (GPU samples arrive), yet neither
  value is written to any file of the run folder (every file, worker copies and logs included);
- the error body shows up in report.html escaped, never as markup.
(The sidecar's own refusals, off-loopback bind without a token and calls without it, are covered
end to end in tests/gpu_sampler/test_sampler_sidecar.py.)
"""

from __future__ import annotations

import json

from rel_procs import ok_answer, run_argv

from analysis import load_run

SERVER_TOKEN = "hdr-s3cret-0f9e8d7c"
GPU_TOKEN = "gpu-s3cret-1a2b3c4d"
SCRIPT = '<script>alert("owned")</script>'


def test_no_secret_in_the_run_folder_and_server_text_is_escaped_in_the_report(procs, tmp_path):
    def script(n: int):  # type: ignore[no-untyped-def]
        if n > 12 and n % 7 == 0:
            return 500, {}, json.dumps({"error": f"{SCRIPT} engine failed"}).encode()
        return ok_answer("hello world")

    srv = procs.server(script)
    car = procs.sidecar("--source", "fake", "--interval-s", "0.1", "--token", GPU_TOKEN)
    run = procs.run(
        run_argv(
            srv,
            tmp_path,
            "--gpu-token",
            GPU_TOKEN,
            "--headers",
            f"Authorization: Bearer {SERVER_TOKEN}; X-Trace: on",
            levels="2",
            step_s=3,
            gpu=f"sidecar:{car.url}",
        )
    )
    run_dir = run.run_dir()
    run.finish_with_report(120)

    assert srv.seen_headers and all(
        h.get("Authorization") == f"Bearer {SERVER_TOKEN}" for h in srv.seen_headers
    )
    gpu_rows = (run_dir / "gpu.csv").read_text().splitlines()
    assert len(gpu_rows) > 2, "the token opened the sidecar: GPU samples arrived"

    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {p.name for p in files} >= {"manifest.json", "requests.csv", "report.html", "summary.json"}
    for path in files:
        data = path.read_bytes()
        for secret in (SERVER_TOKEN, GPU_TOKEN):
            assert secret.encode() not in data, f"{secret} written to {path.relative_to(run_dir)}"
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert "Authorization" in manifest["config"]["headers"], "header names are kept, values masked"

    html = (run_dir / "report.html").read_text()
    errors = load_run(run_dir).requests["error_text"].fillna("")
    assert errors.str.contains("<script>alert(", regex=False).any(), (
        "the body is recorded as the server sent it"
    )
    assert SCRIPT not in html and "<script>alert" not in html
    assert "&lt;script&gt;alert(" in html, "the error text is shown, escaped"


def test_the_recorded_command_line_masks_secret_flags_and_their_prefixes():
    from loadtest.settings.manifest import public_argv

    argv = [
        "loadtest",
        "run",
        "--gpu",
        "sidecar:http://h:9400",
        "--gpu-token",
        "T1",
        "--headers=A: T2",
        "--heade",
        "A: T3",
        "--gpu-tok=T4",
        "--levels",
        "1,2",
    ]
    shown = public_argv(argv)
    assert not {"T1", "A: T2", "A: T3", "T4"} & set(shown) and not any("T2" in a or "T4" in a for a in shown)
    assert shown[:4] == argv[:4] and shown[-2:] == ["--levels", "1,2"]
