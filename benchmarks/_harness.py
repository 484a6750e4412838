"""The one benchmark harness (issue 24 item 4): timers, the copy-bandwidth ceiling, allocator poisoning, and the
report (terminal table, targets, JSON, Markdown and PNG plots under benchmarks/results/<gpu>/).

Shared by bench_activations.py, bench_gemm.py, bench_mlp.py and bench_jax.py (and the coming collective benchmark).
Every number a benchmark prints comes from one of these timers:
  Timer.gpu_us   median GPU time per call: triton.testing.do_bench (it flushes L2 between calls), or CUDA events
                 with a write of a buffer larger than L2 before each timed call;
  Timer.e2e_us   a host loop of N calls, then one synchronize, per call (what a launch-bound op costs a model);
  step_ms        CUDA events around each training step, median (the MLP benchmark);
  interleaved    A, B, A, B ... on the same inputs, L2 flushed before each call, with the ratio of each pair
                 (two ops timed minutes apart see different clocks and temperatures; a pair one call apart does not);
  interleaved_stream  rounds of N back-to-back calls and one wait, alternating between the contenders (a jitted
                 JAX call, which CUDA events on torch's stream cannot bracket; bench_jax.py).
On the CPU (`--cpu-smoke`) the same calls use time.perf_counter so that every script runs end to end without a GPU;
those numbers measure nothing and the report says so.

Nothing here imports transformer_engine_torch: `import_tex()` does, so that a script can fail with exit status 2
and a clear message when the extension is not built.
"""
import csv
import datetime
import gc
import glob
import json
import os
import re
import statistics
import sys
import time

import torch

RESULTS_ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FLUSH_BYTES = 256 * 1024 * 1024  # written before each timed call: 5x the 50 MB L2 of H100, 4x the 60 MB of H200


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def import_tex():
    """transformer_engine_torch, from the repository root when it is not installed (in-place build). Raises
    ImportError with a message that says how to build it."""
    try:
        import transformer_engine_torch as tex
    except ImportError:
        sys.path.insert(0, REPO_ROOT)
        try:
            import transformer_engine_torch as tex
        except ImportError as e:
            raise ImportError(f"cannot import transformer_engine_torch ({e}); build it first (python setup.py "
                              "build_ext --inplace) and run from the repository root") from e
    return tex


def import_torchao():
    """(torchao, None), or (None, why it is unavailable). When torchao is not installed, the newest
    third_party/wheels/torchao-*.whl goes on sys.path first (a GPU machine without pip or network gets the wheel
    carried with the working tree; Python imports its pure-Python float8 training path straight from the zip, and
    torchao skips its compiled extensions, which it cannot load from a zip and which float8 training does not use)."""
    try:
        import torchao
        return torchao, None
    except ImportError as e:
        first = e
    wheels = sorted(glob.glob(os.path.join(REPO_ROOT, "third_party", "wheels", "torchao-*.whl")))
    if not wheels:
        return None, (f"torchao is not installed ({first}) and no third_party/wheels/torchao-*.whl was found (pip "
                      f"download torchao --no-deps -d third_party/wheels, a release built for torch "
                      f"{torch.__version__.split('+')[0]})")
    sys.path.insert(0, wheels[-1])
    try:
        import torchao
        return torchao, None
    except Exception as e:  # a wheel for another torch: its import fails somewhere inside
        return None, f"torchao from {os.path.basename(wheels[-1])} does not import: {type(e).__name__}: {e}"


def gpu_slug(device_name=None):
    """Folder name of a device's results: 'h100', 'h200', 'a100', 'rtx4090'; 'cpu' without CUDA. The first word of
    the name that holds a digit (after 'NVIDIA' and 'GeForce'), lower case, cut at '-'; a bare number keeps the
    word before it. TE_BENCH_GPU overrides it."""
    if os.environ.get("TE_BENCH_GPU"):
        return os.environ["TE_BENCH_GPU"]
    if device_name is None:
        if not torch.cuda.is_available():
            return "cpu"
        device_name = torch.cuda.get_device_name()
    words = [w for w in re.split(r"[\s_]+", device_name) if w and w.lower() not in ("nvidia", "geforce", "tesla")]
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w):
            w = w.split("-")[0].lower()
            if w.isdigit() and i > 0:
                w = words[i - 1].lower() + w
            return re.sub(r"[^a-z0-9]", "", w) or "gpu"
    return re.sub(r"[^a-z0-9]", "", device_name.lower()) or "gpu"


def device_name(device):
    """What a report calls the device: the GPU's name, or 'cpu (smoke run)'."""
    return torch.cuda.get_device_name() if str(device).startswith("cuda") else "cpu (smoke run)"


def synchronize(device):
    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def release(device):
    """Between cases: collect what the last one left and hand the caching allocator's free blocks back, so that the
    next case's peak memory and out-of-memory point do not depend on the ones before it."""
    gc.collect()
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()


_FLUSH = {}


def l2_flush(device):
    """Overwrite a FLUSH_BYTES buffer (allocated once per device) so that the next call starts with a cold L2."""
    if not str(device).startswith("cuda"):
        return
    buf = _FLUSH.get(device)
    if buf is None:
        buf = _FLUSH[device] = torch.empty(FLUSH_BYTES, dtype=torch.int8, device=device)
    buf.zero_()


def _gpu_sleep(cycles):
    """Keep the GPU busy for `cycles` clocks so that the host has enqueued the timed call before its start event
    fires (torch.cuda._sleep; absent in some builds, then nothing)."""
    if cycles and hasattr(torch.cuda, "_sleep"):
        torch.cuda._sleep(int(cycles))


# ----------------------------------------------------------------------------------------------------------
# Timers
# ----------------------------------------------------------------------------------------------------------
class Timer:
    """Median time per call in microseconds. On CUDA: triton.testing.do_bench when triton imports (it flushes L2
    between calls), else CUDA events with l2_flush() before each timed call. On the CPU: perf_counter (smoke runs
    only)."""

    def __init__(self, quick=False, device="cuda"):
        self.device = device
        self.cuda = str(device).startswith("cuda")
        self.warmup_ms, self.rep_ms = (5, 20) if quick else (25, 100)
        self.e2e_iters = 200 if quick else 2000
        self._do_bench = None
        if not self.cuda:
            self.e2e_iters = 5
            self.method = "CPU perf_counter (smoke run: the numbers measure nothing)"
            return
        try:
            from triton.testing import do_bench

            self._do_bench = do_bench
            self.method = f"triton.testing.do_bench(warmup={self.warmup_ms}, rep={self.rep_ms}, median)"
        except Exception:  # triton missing or broken
            self.method = f"CUDA events (warmup {self.warmup_ms} ms, rep {self.rep_ms} ms, median, L2 flush)"

    def gpu_us(self, fn):
        if not self.cuda:
            return _cpu_median_us(fn, reps=3)
        if self._do_bench is not None:
            return 1000.0 * float(self._do_bench(fn, warmup=self.warmup_ms, rep=self.rep_ms, return_mode="median"))
        return self._events_us(fn)

    def _events_us(self, fn):
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(5):
            l2_flush(self.device)
            fn()
        e.record()
        torch.cuda.synchronize()
        est_ms = max(s.elapsed_time(e) / 5, 1e-3)
        for _ in range(max(1, int(self.warmup_ms / est_ms))):
            fn()
        n = max(1, int(self.rep_ms / est_ms))
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(n)]
        for i in range(n):
            l2_flush(self.device)
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return 1000.0 * statistics.median(a.elapsed_time(b) for a, b in zip(starts, ends))

    def e2e_us(self, fn):
        """End-to-end wall time per call: host loop of N calls, then synchronize, / N (median of 3 loops)."""
        for _ in range(50 if self.cuda else 1):
            fn()
        synchronize(self.device)
        per_call = []
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(self.e2e_iters):
                fn()
            synchronize(self.device)
            per_call.append((time.perf_counter() - t0) / self.e2e_iters)
        return 1e6 * statistics.median(per_call)


def step_ms(fn, iters, device, warmup=3):
    """Median time of one training step in ms: CUDA events around each step, synchronised (no L2 flush: a step
    is long enough to make its own cache state); perf_counter on the CPU."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    for _ in range(iters):
        if str(device).startswith("cuda"):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def _cpu_median_us(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e6 * statistics.median(times)


def interleaved(fns, pairs, warmup=3, device="cuda", flush=True, sleep_cycles=0):
    """Time the callables of `fns` ({name: fn}, usually two: ours and the peer) call by call: round i runs each once,
    in the given order on even rounds and reversed on odd ones (A B, B A, A B, ...: calls still alternate, and a
    steady drift of clocks or temperature over the run favours neither side), each call preceded by an L2 flush
    (and `sleep_cycles` of GPU spin, so the host's launch cost stays outside the timed region). Returns
    {name: [us per call, one per round]}: entry i of two names is a pair timed one call apart."""
    names = list(fns)
    cuda = str(device).startswith("cuda")
    for _ in range(warmup):
        for n in names:
            fns[n]()
    synchronize(device)
    marks = {n: [] for n in names}
    for i in range(pairs):
        for n in (names if i % 2 == 0 else names[::-1]):
            if flush:
                l2_flush(device)
            if cuda:
                _gpu_sleep(sleep_cycles)
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fns[n]()
                e.record()
                marks[n].append((s, e))
            else:
                t0 = time.perf_counter()
                fns[n]()
                marks[n].append(time.perf_counter() - t0)
    synchronize(device)
    if cuda:
        return {n: [1000.0 * s.elapsed_time(e) for s, e in marks[n]] for n in names}
    return {n: [1e6 * t for t in marks[n]] for n in names}


def stream_us(call, wait, iters):
    """Wall time per call of `iters` back-to-back calls and one `wait(last output)`: the GPU time per call when the
    host enqueues faster than the GPU runs (large calls), the host's cost per call when it does not (small ones)."""
    t0 = time.perf_counter()
    out = None
    for _ in range(iters):
        out = call()
    wait(out)
    return 1e6 * (time.perf_counter() - t0) / iters


def interleaved_stream(fns, rounds, iters):
    """stream_us of each of `fns` ({name: (call, wait)}), round by round, the order alternating per round (as
    interleaved() does), after one warm call each. Returns {name: [us per call, one per round]}: entry i of two names
    was timed one round apart (pair_ratios applies). For frameworks whose calls torch's CUDA events cannot bracket
    (a jitted JAX program runs on XLA's own stream)."""
    names = list(fns)
    for n in names:
        call, wait = fns[n]
        wait(call())
    times = {n: [] for n in names}
    for r in range(rounds):
        for n in (names if r % 2 == 0 else names[::-1]):
            times[n].append(stream_us(*fns[n], iters))
    return times


def spread(values):
    """Median, 10th / 90th percentile (nearest rank), min, max and count of a list of numbers."""
    v = sorted(values)
    if not v:
        return {"median": None, "p10": None, "p90": None, "min": None, "max": None, "n": 0}

    def rank(q):
        return v[min(len(v) - 1, max(0, round(q * (len(v) - 1))))]

    return {"median": statistics.median(v), "p10": rank(0.1), "p90": rank(0.9), "min": v[0], "max": v[-1],
            "n": len(v)}


def pair_ratios(times, ours, peer):
    """Per-pair speed ratio of `ours` over `peer` from interleaved() times: peer us / ours us for each round
    (above 1 means ours is faster)."""
    return [p / o for o, p in zip(times[ours], times[peer])]


def measure_copy_bandwidth(timer, shape=(16384, 8192)):
    """Device-to-device copy of a bf16 buffer (16384x8192 = 268 MB by default); bytes = read + write."""
    src = torch.randn(shape, device=timer.device, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    us = timer.gpu_us(lambda: dst.copy_(src))
    nbytes = 2 * src.numel() * src.element_size()
    del src, dst
    return {"bytes": nbytes, "us": us, "gbs": nbytes / us / 1e3}


def poison_allocator(nbytes_list, device="cuda"):
    """Fill soon-to-be-reused allocator blocks with 0xFF (NaN in bf16 and E4M3) so unwritten outputs show. Does
    nothing on the CPU, whose allocator does not hand blocks back the same way."""
    if not str(device).startswith("cuda"):
        return
    blocks = [torch.full((max(int(n), 1),), 0xFF, dtype=torch.uint8, device=device) for n in nbytes_list]
    torch.cuda.synchronize()
    del blocks


def cuda_memory_reset(device):
    """Free cached blocks and start a new peak-memory window; returns the bytes allocated now (the window's base)."""
    if not str(device).startswith("cuda"):
        return None
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def cuda_memory_peak(device, base):
    """Peak bytes allocated since cuda_memory_reset() above its base (torch.cuda.max_memory_allocated); None on the
    CPU."""
    if base is None:
        return None
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


# ----------------------------------------------------------------------------------------------------------
# Report: rows, table, targets, JSON / CSV / Markdown, plots
# ----------------------------------------------------------------------------------------------------------
def fmt(v, f):
    return "-" if v is None else f.format(v)


def markdown_table(columns, rows, valid_key="valid", invalid_keep=1):
    """Lines of a Markdown table (so the block can be quoted as is). columns: (header, key, format) triples; a row
    whose `valid_key` is False shows its first `invalid_keep` cells, then INVALID."""
    cells = [[h for h, _, _ in columns]]
    for r in rows:
        if r.get(valid_key, True):
            cells.append([fmt(r.get(k), f) for _, k, f in columns])
        else:
            kept = [fmt(r.get(k), f) for _, k, f in columns[:invalid_keep]]
            cells.append(kept + ["INVALID"] + [""] * (len(columns) - invalid_keep - 1))
    widths = [max(len(c[i]) for c in cells) for i in range(len(columns))]

    def line(c):
        return "| " + " | ".join(s.ljust(w) if i == 0 else s.rjust(w) for i, (s, w) in enumerate(zip(c, widths))) + " |"

    rule = "|" + "|".join(":" + "-" * (w + 1) if i == 0 else "-" * (w + 1) + ":" for i, w in enumerate(widths)) + "|"
    return [line(cells[0]), rule] + [line(c) for c in cells[1:]]


class Report:
    """What one benchmark run found: meta, rows, targets, text and figures. `emit` prints a line and keeps it for
    the Markdown copy; `save` writes <out_dir>/<bench>.json and .md and the plots drawn with `plot`."""

    def __init__(self, bench, meta=None):
        self.bench = bench
        self.meta = dict(meta or {})
        self.meta.setdefault("date", datetime.datetime.now().isoformat(timespec="seconds"))
        self.meta.setdefault("torch", torch.__version__)
        self.rows = []
        self.targets = []
        self.extra = {}
        self.lines = []
        self._plots = []  # (file name, draw function, figure size)

    def emit(self, line=""):
        print(line, flush=True)
        self.lines.extend(str(line).split("\n"))

    def table(self, columns, rows=None, **kw):
        for line in markdown_table(columns, self.rows if rows is None else rows, **kw):
            self.emit(line)

    # ---- targets ------------------------------------------------------------------------------------------------
    def target(self, label, status, measured, required):
        self.targets.append({"target": label, "status": status, "measured": measured, "required": required})

    def at_least(self, label, value, need, measured_fmt, required):
        """MET when value >= need; NOT MEASURED when value is None."""
        if value is None:
            return self.target(label, "NOT MEASURED", None, required)
        self.target(label, "MET" if value >= need else "NOT MET", measured_fmt.format(value), required)

    def at_most(self, label, value, need, measured_fmt, required):
        """MET when value <= need; NOT MEASURED when value is None."""
        if value is None:
            return self.target(label, "NOT MEASURED", None, required)
        self.target(label, "MET" if value <= need else "NOT MET", measured_fmt.format(value), required)

    def summary(self, noun, seconds, smoke=False):
        """The closing line: rows validated, targets met, run time; a smoke run adds that its times mean nothing."""
        valid = sum(bool(r["valid"]) for r in self.rows)
        met = sum(t["status"] == "MET" for t in self.targets)
        self.emit(f"\nSummary: {valid}/{len(self.rows)} {noun} validated; targets met {met}/{len(self.targets)}; "
                  f"run took {seconds:.0f} s")
        if smoke:
            self.emit("(cpu smoke run: tiny shapes on the CPU; validation is real, the times measure nothing)")

    def print_targets(self, title):
        self.emit(f"\n{title}")
        if not self.targets:
            return self.emit("  (none)")
        w = max(len(t["target"]) for t in self.targets)
        for t in self.targets:
            self.emit(f"  {t['status']:<12} {t['target']:<{w}}  measured {t['measured'] or '-'}  "
                      f"(required {t['required']})")

    # ---- plots --------------------------------------------------------------------------------------------------
    def plot(self, name, draw, figsize=(10, 6)):
        """Queue a figure: draw(fig) fills a matplotlib figure; save() writes it as <out_dir>/<name>.png."""
        self._plots.append((name, draw, figsize))

    def _save_plots(self, out_dir):
        if not self._plots:
            return []
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except Exception as e:  # matplotlib missing: the JSON still carries every number
            log(f"matplotlib not available ({type(e).__name__}: {e}): no plots, JSON and Markdown only")
            return []
        written = []
        for name, draw, figsize in self._plots:
            fig = plt.figure(figsize=figsize)
            try:
                draw(fig)
                fig.text(0.995, 0.005, f"{self.meta.get('device', '?')}, torch {self.meta.get('torch', '?')}, "
                         f"{self.meta.get('date', '')}" + (" (quick)" if self.meta.get("quick") else ""),
                         ha="right", va="bottom", fontsize=7, color="gray")
                path = os.path.join(out_dir, f"{name}.png")
                fig.savefig(path, dpi=100, bbox_inches="tight")
                written.append(path)
            except Exception as e:  # a broken plot must not lose the run's numbers
                log(f"plot {name} failed: {type(e).__name__}: {e}")
            finally:
                plt.close(fig)
        return written

    # ---- files --------------------------------------------------------------------------------------------------
    def save(self, out_dir=None, json_path=None, csv_path=None):
        """Write <out_dir>/<bench>.json, <bench>.md and the queued plots (out_dir None: none of them), and the
        optional extra JSON / CSV copies. Returns the paths written."""
        written = []
        doc = {"bench": self.bench, "meta": self.meta, "rows": self.rows, "targets": self.targets, **self.extra}
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
            doc["figures"] = [os.path.basename(p) for p in self._save_plots(out_dir)]
            written += [os.path.join(out_dir, f) for f in doc["figures"]]
            md = os.path.join(out_dir, f"{self.bench}.md")
            with open(md, "w") as f:
                f.write("\n".join(self.lines).strip("\n") + "\n")
            written.append(md)
            path = os.path.join(out_dir, f"{self.bench}.json")
            _write_json(path, doc)
            written.append(path)
        if json_path:
            _write_json(json_path, doc)
            written.append(json_path)
        if csv_path:
            keys = list(self.rows[0].keys()) if self.rows else []
            os.makedirs(os.path.dirname(os.path.abspath(csv_path)), exist_ok=True)
            with open(csv_path, "w", newline="") as f:
                w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
                w.writeheader()
                for r in self.rows:
                    w.writerow(r)
            written.append(csv_path)
        for p in written:
            log(f"wrote {os.path.relpath(p)}")
        return written


def _write_json(path, doc):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        json.dump(doc, f, indent=2, default=str)


def default_out_dir(smoke=False):
    """benchmarks/results/<gpu>/ (benchmarks/results/cpu/ for smoke runs, which git ignores)."""
    return os.path.join(RESULTS_ROOT, "cpu" if smoke else gpu_slug())


def add_output_args(p):
    """--out-dir, --no-save, --json, --cpu-smoke: the options every benchmark shares."""
    p.add_argument("--out-dir", metavar="DIR",
                   help="where <bench>.json/.md/.png go (default: benchmarks/results/<gpu>/)")
    p.add_argument("--no-save", action="store_true", help="print only; write no JSON, Markdown or plots")
    p.add_argument("--json", metavar="PATH", help="also write the report's JSON (meta, rows, targets) here")
    p.add_argument("--cpu-smoke", action="store_true",
                   help="run end to end on the CPU with tiny shapes (exercises validation, JSON and plots; no timing "
                        "claims); results go to benchmarks/results/cpu/")


def start(args, prog):
    """(device, transformer_engine_torch) of a run: 'cpu' with --cpu-smoke, else 'cuda'. (None, None) after saying
    why the run cannot start (no CUDA device, extension not built); the script then exits with status 2."""
    device = "cpu" if args.cpu_smoke else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print(f"{prog}: CUDA is not available: this benchmark needs a GPU (or --cpu-smoke)", file=sys.stderr)
        return None, None
    try:
        return device, import_tex()
    except ImportError as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return None, None


def start_jax(args, prog):
    """start()'s (device, tex) plus (jax, transformer_engine_jax) for the JAX benchmarks, with jax on its CPU platform
    under --cpu-smoke; all None after saying why the run cannot start (exit status 2)."""
    device, tex = start(args, prog)
    if device is None:
        return None, None, None, None
    if args.cpu_smoke:
        os.environ["JAX_PLATFORMS"] = "cpu"
    try:
        import jax
        import transformer_engine_jax as tej
    except ImportError as e:
        print(f"{prog}: cannot import jax / transformer_engine_jax ({e})", file=sys.stderr)
        return None, None, None, None
    return device, tex, jax, tej


def out_dir_of(args, partial=False):
    """The results folder a run writes: --out-dir, else the default one unless --no-save or the run is partial
    (e.g. --only), so that a partial run never overwrites a full report."""
    if args.no_save:
        return None
    if args.out_dir:
        return args.out_dir
    return None if partial else default_out_dir(args.cpu_smoke)


# ----------------------------------------------------------------------------------------------------------
# Plot helpers (matplotlib is imported by Report.save before any draw function runs)
# ----------------------------------------------------------------------------------------------------------
def grouped_bars(ax, groups, series, horizontal=False, errors=None, colors=None, value_fmt=None):
    """Bars of several series per group. series: {label: [value or None per group]}; errors: {label: ([low], [high])}
    absolute error-bar ends (None entries skipped). None values leave a gap."""
    n = max(len(series), 1)
    width = 0.8 / n
    for j, (label, values) in enumerate(series.items()):
        idx = [i for i, v in enumerate(values) if v is not None]
        if not idx:
            continue
        ps = [i - 0.4 + width * (j + 0.5) for i in idx]
        vs = [values[i] for i in idx]
        kw = {"label": label}
        if colors and label in colors:
            kw["color"] = colors[label]
        if errors and label in errors:
            lo, hi = errors[label]
            low = [values[i] - (lo[i] if lo[i] is not None else values[i]) for i in idx]
            high = [(hi[i] if hi[i] is not None else values[i]) - values[i] for i in idx]
            kw["xerr" if horizontal else "yerr"] = [low, high]
            kw["capsize"] = 2
        bars = (ax.barh if horizontal else ax.bar)(ps, vs, width, **kw)
        if value_fmt:
            ax.bar_label(bars, labels=[value_fmt.format(v) for v in vs], fontsize=6, padding=1)
    if horizontal:
        ax.set_yticks(range(len(groups)))
        ax.set_yticklabels(groups, fontsize=7)
        ax.invert_yaxis()
    else:
        ax.set_xticks(range(len(groups)))
        ax.set_xticklabels(groups, fontsize=8, rotation=15, ha="right")
