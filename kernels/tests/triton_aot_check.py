"""Compile the Triton row kernels ahead of time, for sm_80 and sm_90, exactly as the JIT would compile
them for the launches the real code makes -- without a GPU -- and report each binary's registers,
spills and shared memory.

Faithful to the launches, not to a hand-written signature:

1. ``triton_kernels._logprobs_fwd_kernel`` / ``_logprobs_bwd_kernel`` are replaced by recorders that
   accept ``kernel[grid](*args, **kwargs)``; ``triton_kernels.launch_config`` answers what it
   answers for a CUDA device (``BLOCK_V``, ``num_warps``).
2. The real chunk loops run on CPU tensors -- ``chunked.logprobs_forward``,
   ``chunked.logprobs_backward`` and ``chunked.policy_loss_pass`` with a ``TritonRowPass`` -- with
   the rows per chunk that ``chunked.chunk_rows_for`` gives a CUDA device (its 512 MiB default
   budget) and ``T`` rows such that every loop makes two chunks (so the slices at a chunk offset
   are among the arguments). The matmuls run on CPU with a narrow ``H`` (the kernels never see H).
3. Each captured launch is specialised as ``JITFunction.run`` does in triton 3.9: the binder from
   ``create_function_from_signature(fn.signature, fn.params, backend)`` (``backend`` for
   ``GPUTarget("cuda", cc, 32)``), the options ``run`` adds, then ``fn._pack_args`` -- so pointer
   and integer arguments get the divisibility-by-16 attributes of their actual values (``V`` and
   the row stride of an odd vocabulary get none).
4. Cross-check: every launch is also passed (for each target) to the *unpatched* kernel's own ``run`` under a stand-in
   driver (it answers the target and device, nothing else) with a ``jit_cache_hook`` that records
   what the JIT would compile and stops it there; the two must agree on signature, constexprs,
   attributes and options.
5. Identical specialisations are compiled once (``triton.compile(ASTSource(...))``); registers and
   stack/local bytes come from ``cuobjdump --dump-resource-usage``, shared memory from
   ``kernel.metadata.shared``.

Run by ``test_kernels_triton_compile.py`` in a subprocess (TRITON_INTERPRET must be unset when
triton is imported). Prints JSON on stdout; ``--table`` prints a markdown table instead;
``--launch-config BLOCK_V,WARPS`` compiles at that config instead of the default.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import tempfile
import warnings

os.environ.pop("TRITON_INTERPRET", None)
os.environ.pop("MOPD_KERNELS_CHUNK_MB", None)  # the CUDA default budget, as a GPU run without overrides
os.environ.pop("MOPD_KERNELS_BLOCK_V", None)
os.environ.pop("MOPD_KERNELS_NUM_WARPS", None)
warnings.filterwarnings("ignore", message="TRITON_DEFAULT_FP_FUSION")

import torch  # noqa: E402
import triton  # noqa: E402
from triton import knobs  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource, make_backend  # noqa: E402
from triton.runtime.jit import driver as jit_driver  # noqa: E402  (the DriverConfig the JIT asks)
from triton.runtime.jit import create_function_from_signature, serialize_specialization_data  # noqa: E402

from mopd_kernels import chunked  # noqa: E402
from mopd_kernels import triton_kernels as tk  # noqa: E402
from mopd_kernels import LossInputs, PolicyLossSettings, RoleSpec  # noqa: E402

VOCABS = {"qwen3": 151_936, "llama3": 128_256, "odd": 32_003}
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SHARED_LIMIT = {80: 163 * 1024, 90: 227 * 1024}
"""Largest shared memory one block may use (opt-in maximum): A100 (sm_80) 163 KiB, H100/H200 (sm_90) 227 KiB."""
KERNEL_NAMES = ("_logprobs_fwd_kernel", "_logprobs_bwd_kernel")
H = 8
CUDA = torch.device("cuda")
OUTPUTS = {"_logprobs_fwd_kernel": ("logp_ptr", "ent_ptr", "lse_ptr")}


# ---------------------------------------------------------------------------------------------
# Specialisation as JITFunction.run computes it
# ---------------------------------------------------------------------------------------------

_BINDERS = {}


def _binder(fn, cc):
    key = (fn.__name__, cc)
    if key not in _BINDERS:
        backend = make_backend(GPUTarget("cuda", cc, 32))
        _BINDERS[key] = (backend, create_function_from_signature(fn.signature, fn.params, backend))
    return _BINDERS[key]


def _run_kwargs(fn, kwargs):
    """The options ``JITFunction.run`` adds to the launch's keyword arguments before binding."""
    kwargs = dict(kwargs)
    kwargs["debug"] = kwargs.get("debug", fn.debug) or knobs.runtime.debug
    kwargs["instrumentation_mode"] = knobs.compilation.instrumentation_mode
    kwargs["fpsan_homomorphic_casts"] = knobs.compilation.fpsan_homomorphic_casts
    return kwargs


def specialise(fn, cc, args, kwargs):
    """``(options, signature, constexprs, attrs)`` the JIT would compile this launch with on sm_<cc>."""
    backend, binder = _binder(fn, cc)
    kwargs = _run_kwargs(fn, kwargs)
    bound_args, specialization, options = binder(*args, **kwargs)
    return fn._pack_args(backend, kwargs, bound_args, specialization, options)


def _serialised(fn, spec, cc):
    options, signature, constexprs, attrs = spec
    data = json.loads(serialize_specialization_data(fn.__name__, signature, constexprs, attrs, options, None,
                                                    GPUTarget("cuda", cc, 32)))
    return {k: data[k] for k in ("signature", "constant_keys", "constant_vals", "attrs_keys", "attrs_vals",
                                 "options")}


class _StandInDriver:
    """Answers the JIT's questions about the current device (target, device id, stream); nothing runs."""

    def __init__(self, cc):
        self.cc = cc

    def get_current_target(self):
        return GPUTarget("cuda", self.cc, 32)

    def get_current_device(self):
        return ("aot-check", self.cc)

    def get_current_stream(self, device=None):
        return 0


def jit_specialisation(fn, cc, grid, args, kwargs):
    """What the unpatched ``fn[grid](*args, **kwargs)`` hands to the compiler on sm_<cc>, taken from
    its ``jit_cache_hook`` (which then stops the compile and the launch)."""
    seen = []

    def hook(*, compile, **_):
        data = json.loads(compile["specialization_data"])
        seen.append({k: data[k] for k in ("signature", "constant_keys", "constant_vals", "attrs_keys",
                                          "attrs_vals", "options")})
        return True  # skip the compile: run() returns before launching

    saved_driver, saved_hook = jit_driver._active, knobs.runtime.jit_cache_hook
    jit_driver.set_active(_StandInDriver(cc))
    knobs.runtime.jit_cache_hook = hook
    try:
        fn[grid](*args, **kwargs)
    finally:
        knobs.runtime.jit_cache_hook = saved_hook
        jit_driver._active = saved_driver
        fn.device_caches.pop(("aot-check", cc), None)
    assert len(seen) == 1, seen
    return seen[0]


# ---------------------------------------------------------------------------------------------
# Recording the launches of the real chunk loops
# ---------------------------------------------------------------------------------------------


class LaunchRecorder:
    """Stands in for a ``@triton.jit`` kernel: ``kernel[grid](*args, **kwargs)`` records the launch
    (its specialisation for every target, and whether the JIT's own run agrees) and zeroes the
    kernel's outputs so the torch code after it sees finite values."""

    def __init__(self, fn, log, context):
        self.fn = fn
        self.log = log
        self.context = context  # dict: the loop, dtype and V being run

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            named = dict(zip(self.fn.arg_names, args))
            specs = {cc: specialise(self.fn, cc, args, kwargs) for cc in SHARED_LIMIT}
            agrees = all(jit_specialisation(self.fn, cc, grid, args, kwargs) == _serialised(self.fn, spec, cc)
                         for cc, spec in specs.items())
            ptr_mod16 = {k: v.data_ptr() % 16 for k, v in named.items() if isinstance(v, torch.Tensor)}
            for name in OUTPUTS.get(self.fn.__name__, ()):
                named[name].zero_()
            self.log.append({**self.context, "kernel": self.fn.__name__, "grid": list(grid), "specs": specs,
                             "jit_agrees": agrees, "ptr_mod16": ptr_mod16})
        return launch


def _rows_two_chunks(V, dtype):
    """``(T, C)``: rows such that the CUDA default sizing makes two chunks, and those chunks' rows."""
    bpl = tk.TritonRowPass.bytes_per_logit(dtype)
    elt = torch.empty((), dtype=dtype).element_size()
    big = chunked.chunk_rows_for(1 << 24, V, bpl, CUDA, H=H, element_size=elt)
    T = big + big // 2
    C = chunked.chunk_rows_for(T, V, bpl, CUDA, H=H, element_size=elt)
    assert -(-T // C) >= 2, (T, C)
    return T, C


def record_launches():
    log = []
    context = {}
    saved = (tk._logprobs_fwd_kernel, tk._logprobs_bwd_kernel, tk.launch_config)
    real_launch_config = tk.launch_config
    tk._logprobs_fwd_kernel = LaunchRecorder(saved[0], log, context)
    tk._logprobs_bwd_kernel = LaunchRecorder(saved[1], log, context)
    tk.launch_config = lambda V, device: real_launch_config(V, CUDA)
    try:
        gen = torch.Generator().manual_seed(0)
        for dname, dtype in DTYPES.items():
            for vname, V in VOCABS.items():
                T, C = _rows_two_chunks(V, dtype)
                hidden = torch.randn(T, H, generator=gen).to(dtype)
                weight = torch.randn(V, H, generator=gen).to(dtype)
                targets = torch.randint(0, V, (T,), generator=gen)
                targets[::7] = -100  # padding targets, as the trainer passes them
                loop = chunked.ChunkLoop(tk.TritonRowPass(), 0.7, C)
                context.update(dtype=dname, V=V, vocab=vname, T=T, chunk_rows=C)

                context["loop"] = "logprobs_forward"
                logp, entropy, lse = chunked.logprobs_forward(hidden, weight, targets, loop, with_entropy=True)
                context["loop"] = "logprobs_backward"
                g = (torch.randn(T, generator=gen), torch.randn(T, generator=gen))
                chunked.logprobs_backward(g, hidden, weight, targets, (lse, entropy), loop,
                                          chunked.GradRequest(True, True))
                context["loop"] = "policy_loss_pass"
                settings = PolicyLossSettings(role_specs=(RoleSpec("outcome", entropy_coef=1e-3),),
                                              temperature=0.7, chunk_rows=C, backend="triton")
                targets_l = targets.clamp(min=0)
                inputs = LossInputs(roles=torch.zeros(T, dtype=torch.long),
                                    old_logp=-torch.rand(T, generator=gen),
                                    advantages=torch.randn(T, generator=gen)).for_kernels()
                chunked.policy_loss_pass(hidden, weight, targets_l, inputs, settings, tk.TritonRowPass(),
                                         chunked.GradRequest(True, True, None))
                if dname == "bf16":  # a soft-capped, scaled head (Gemma 2 trains in bf16): HAS_CAP compiles too
                    context["loop"] = "capped_policy_loss_pass"
                    capped = dataclasses.replace(settings, logit_scale=0.5, logit_softcap=30.0)
                    chunked.policy_loss_pass(hidden, weight, targets_l, inputs, capped, tk.TritonRowPass(),
                                             chunked.GradRequest(True, True, None))
                del hidden, weight
    finally:
        tk._logprobs_fwd_kernel, tk._logprobs_bwd_kernel, tk.launch_config = saved
    return log


# ---------------------------------------------------------------------------------------------
# Compiling each distinct specialisation
# ---------------------------------------------------------------------------------------------


def resources(cubin: bytes):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    line = next(x for x in out.splitlines() if "REG:" in x)
    fields = dict(item.split(":", 1) for item in line.split() if ":" in item)
    return {"regs": int(fields["REG"]), "stack": int(fields["STACK"]), "local": int(fields["LOCAL"])}


def _aligned_args(fn, spec):
    """Names of the arguments the binary assumes divisible by 16 (``tt.divisibility``)."""
    _, _, _, attrs = spec
    names = fn.arg_names
    return sorted(names[path[0]] for path, val in attrs.items() if any(a[0] == "tt.divisibility" for a in val))


def compile_all(log):
    fns = {name: getattr(tk, name) for name in KERNEL_NAMES}
    groups = {}
    for rec in log:
        for cc, spec in rec["specs"].items():
            options, signature, constexprs, attrs = spec
            key = (rec["kernel"], cc, json.dumps(_serialised(fns[rec["kernel"]], spec, cc), sort_keys=True))
            g = groups.setdefault(key, {"spec": spec, "vocabs": set(), "dtypes": set(), "loops": set(),
                                        "launches": 0})
            g["vocabs"].add(rec["V"])
            g["dtypes"].add(rec["dtype"])
            g["loops"].add(rec["loop"])
            g["launches"] += 1
    binaries = []
    order = lambda kv: (kv[0][0], kv[0][1], sorted(kv[1]["dtypes"]), sorted(kv[1]["vocabs"]))  # noqa: E731
    for (kernel, cc, _), g in sorted(groups.items(), key=order):
        fn = fns[kernel]
        options, signature, constexprs, attrs = g["spec"]
        compiled = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=GPUTarget("cuda", cc, 32),
                                  options=options.__dict__)
        binaries.append({
            "kernel": kernel, "target": f"sm_{cc}", "dtype": "/".join(sorted(g["dtypes"])),
            "vocabs": sorted(g["vocabs"]), "loops": sorted(g["loops"]), "launches": g["launches"],
            "block_v": constexprs[(fn.arg_names.index("BLOCK_V"),)], "num_warps": options.num_warps,
            "aligned_args": _aligned_args(fn, g["spec"]),
            "attrs": {fn.arg_names[p[0]]: v for p, v in attrs.items()},
            "shared": compiled.metadata.shared, "shared_limit": SHARED_LIMIT[cc],
            **resources(compiled.asm["cubin"]),
        })
    return binaries


def main():
    if "--launch-config" in sys.argv:  # e.g. --launch-config 8192,16: a candidate of bench/gpu_kernels.py's sweep
        block, warps = map(int, sys.argv[sys.argv.index("--launch-config") + 1].split(","))
        tk.set_launch_config(block, warps)
    log = record_launches()
    launches = [{k: v for k, v in rec.items() if k != "specs"} for rec in log]
    binaries = compile_all(log)
    result = {"launches": launches, "binaries": binaries}
    if "--table" in sys.argv:
        print("| kernel | dtype | V | target | BLOCK_V x warps | aligned args | regs | stack | local | shared (B) |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for b in binaries:
            print(f"| {b['kernel']} | {b['dtype']} | {', '.join(map(str, b['vocabs']))} | {b['target']} | "
                  f"{b['block_v']} x {b['num_warps']} | {', '.join(b['aligned_args'])} | {b['regs']} | "
                  f"{b['stack']} | {b['local']} | {b['shared']} |")
        n_agree = sum(rec["jit_agrees"] for rec in launches)
        print(f"\n{len(launches)} launches captured; the JIT's own run agrees on {n_agree}")
    else:
        json.dump(result, sys.stdout)


if __name__ == "__main__":
    main()
