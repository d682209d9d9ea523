"""What a person waits for in `fid serve`'s page: seconds per question through HTTP.

Starts `fid serve --run RUN --port 0` in its own process (the command as a user runs it), waits
for the URL it prints (the start-up: importing torch and transformers, loading the models),
then asks the questions of a jsonl file one at a time through POST /api/ask and prints, per
question, the wall seconds the client waited (HTTP and JSON included), the seconds the server
spent answering (the reply's "seconds": search, generation and the attention shares), and the
server process's CPU seconds (psutil; on a loaded machine wall time measures the load, CPU time
the work).

    python benchmarks/reader/serve_latency.py --run results/demo            # the demo's test set
    python benchmarks/reader/serve_latency.py --run results/demo --questions Q.jsonl --n 50
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # `benchmarks.harness` however this file is run

from benchmarks.harness import record, table_header, table_row, write_record  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", type=Path, required=True, help="a finished run folder")
    parser.add_argument("--questions", type=Path,
                        help="jsonl with a question a record (default: the demo's test split)")  # fmt: skip
    parser.add_argument("--n", type=int, default=300, help="questions asked (default 300)")
    parser.add_argument("--threads", type=int, default=1, help="fid's torch threads (default 1)")
    parser.add_argument("--json", type=Path, help="write the run's JSON record here")
    args = parser.parse_args()
    path = args.questions or args.run / "data/demo/world/test.jsonl"
    questions = [json.loads(line)["question"] for line in path.read_text().splitlines()][: args.n]

    started = time.perf_counter()
    server = subprocess.Popen(
        [sys.executable, "-m", "fid", "--threads", str(args.threads), "serve", "--run",
         str(args.run), "--port", "0"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )  # fmt: skip
    try:
        line = server.stdout.readline()
        start_s = time.perf_counter() - started
        if "listening on" not in line:
            raise SystemExit(f"fid serve did not start: {line!r}")
        port = int(line.split()[4].rstrip("/").rsplit(":", 1)[1])
        process = psutil.Process(server.pid)
        rows = [_ask(port, process, question) for question in questions]
    finally:
        server.terminate()
        server.wait()

    wall, answer, cpu = (sorted(row[i] for row in rows) for i in range(3))
    figures = {
        "questions": len(rows), "threads": args.threads, "start_s": start_s,
        "wall_median_s": statistics.median(wall), "wall_p90_s": wall[int(0.9 * len(wall))],
        "wall_max_s": wall[-1], "answer_median_s": statistics.median(answer),
        "cpu_median_s": statistics.median(cpu), "over_1_s": sum(w > 1.0 for w in wall),
    }  # fmt: skip
    print(f"fid serve --run {args.run}: {len(rows)} questions of {path}, {args.threads} thread(s)")
    print(table_header(["start s", "wall median s", "wall p90 s", "wall max s",
                        "answer median s", "server CPU median s", "over 1 s"]))  # fmt: skip
    print(table_row([f"{start_s:.1f}", f"{figures['wall_median_s']:.3f}",
                     f"{figures['wall_p90_s']:.3f}", f"{figures['wall_max_s']:.3f}",
                     f"{figures['answer_median_s']:.3f}", f"{figures['cpu_median_s']:.3f}",
                     figures["over_1_s"]]))  # fmt: skip
    if args.json:
        write_record(args.json, record(__file__, figures))


def _ask(port: int, process: psutil.Process, question: str) -> tuple[float, float, float]:
    """(client wall s, server answer s, server CPU s) of one question."""
    body = json.dumps({"question": question}).encode()
    cpu = sum(process.cpu_times()[:2])
    started = time.perf_counter()
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    connection.request("POST", "/api/ask", body, {"Content-Type": "application/json"})
    response = connection.getresponse()
    reply = json.loads(response.read())
    wall = time.perf_counter() - started
    connection.close()
    if response.status != 200:
        raise SystemExit(f"{question!r}: HTTP {response.status}: {reply}")
    return wall, reply["seconds"], sum(process.cpu_times()[:2]) - cpu


if __name__ == "__main__":
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # the run's folders hold every model
    main()
