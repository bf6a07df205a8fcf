"""A small classifier whose Dataset fetches each example over HTTP from a slow object store,
loaded by a DataLoader with 2 worker processes: the workers spend their time blocked in the
network read (not on a CPU), and the training loop waits for its batches.

    python dataloader_io.py [--batches N] [--latency-ms MS]

The store is a local HTTP server in a process of its own that answers each request after
MS milliseconds, as a remote bucket would (a worker waiting in recv() is blocked: neither on a
CPU nor runnable). Each item reports how long its fetch took and how much CPU its worker spent
on it; the loop times its waits inside the DataLoader's `__next__` (as the PyTorch ImageNet
example does) and writes both to $JOB_TRUTH (truth.py).
"""
from truth import main_thread, record
from dataloader_bound import VOCAB, BagOfEmbeddings     # the same model, its examples fetched

import argparse
import subprocess
import sys
import time
import urllib.request

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

SEQ = 128

STORE = """
import sys, time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
latency = float(sys.argv[1]) / 1000
class Store(BaseHTTPRequestHandler):
    def do_GET(self):
        time.sleep(latency)                         # the bucket's first-byte latency
        i = int(self.path.rsplit("/", 1)[-1])
        body = bytes((i * 7 + k) % 251 for k in range(2 * 128))
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
server = ThreadingHTTPServer(("127.0.0.1", 0), Store)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


class RemoteExamples(Dataset):
    """Example i is GET http://store/example/i: 256 bytes, read as 128 token ids."""

    def __init__(self, n: int, url: str):
        self.n, self.url = n, url

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        cpu0, t0 = time.process_time(), time.perf_counter()
        with urllib.request.urlopen(f"{self.url}/example/{i}", timeout=30) as r:
            raw = r.read()
        fetch_s = time.perf_counter() - t0
        ids = torch.tensor([(raw[2 * k] << 8 | raw[2 * k + 1]) % VOCAB for k in range(SEQ)])
        item_s = time.perf_counter() - t0
        return ids, torch.tensor(sum(raw) % 4), torch.tensor([fetch_s, item_s, time.process_time() - cpu0],
                                                              dtype=torch.float64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", type=int, default=40)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--latency-ms", type=float, default=40.0)
    args = ap.parse_args()

    store = subprocess.Popen([sys.executable, "-c", STORE, str(args.latency_ms)], stdout=subprocess.PIPE, text=True)
    try:
        url = f"http://127.0.0.1:{int(store.stdout.readline())}"
        torch.manual_seed(0)
        torch.set_num_threads(1)
        model = BagOfEmbeddings()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
        loader = DataLoader(RemoteExamples(args.batches * args.batch_size, url), batch_size=args.batch_size,
                            num_workers=2, shuffle=True)
        data_time = 0.0
        steps = 0
        per_item = torch.zeros(3, dtype=torch.float64)
        loop_start = end = time.perf_counter()
        delay_before = main_thread()[1]      # the loop's own run delay (truth.py)
        for ids, labels, timing in loader:
            data_time += time.perf_counter() - end
            per_item += timing.sum(0)
            loss = nn.functional.cross_entropy(model(ids), labels)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            steps += 1
            end = time.perf_counter()
        loop_s = time.perf_counter() - loop_start
    finally:
        store.kill()
        store.wait()
    fetch_s, item_s, item_cpu_s = per_item.tolist()
    print(f"{steps} steps, data time {data_time:.2f} s of {loop_s:.2f} s; "
          f"workers fetching {fetch_s / item_s:.0%} of their item time", flush=True)
    record("dataloader_io", steps=steps, next_wait_s=data_time, loop_s=loop_s,
           loop_run_delay_s=main_thread()[1] - delay_before,
           worker_fetch_s=fetch_s, worker_item_s=item_s, worker_item_cpu_s=item_cpu_s)


if __name__ == "__main__":
    main()
