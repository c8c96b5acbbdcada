"""Compile the Triton kernels for an H100/H200 (sm_90) without a GPU, with the real (not the
interpreted) Triton frontend, and print each variant's register and stack use.

Run by ``test_kernels_triton_compile.py`` in a subprocess (TRITON_INTERPRET must be unset when
triton is imported). The interpreter accepts code that the compiler rejects (types, loop-carried
values, constexpr use), so this is the CPU-side guard for the compiled path.
"""

import json
import os
import subprocess
import sys
import tempfile

os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from mopd_kernels import triton_kernels as tk  # noqa: E402

FLOATS = {"inv_t", "clip_low", "clip_high", "dual_clip"}
POINTERS = {"targets_ptr": "*i64", "role_ptr": "*i32"}


def signature(fn, dtype):
    sig = {}
    for param in fn.params:
        name = param.name
        if param.is_constexpr:
            sig[name] = "constexpr"
        elif name == "z_ptr":
            sig[name] = f"*{dtype}"
        elif name.endswith("_ptr"):
            sig[name] = POINTERS.get(name, "*fp32")
        elif name in FLOATS:
            sig[name] = "fp32"
        else:
            sig[name] = "i32"
    return sig


def resources(cubin: bytes):
    tool = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "cuobjdump")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        out = subprocess.run([tool, "--dump-resource-usage", f.name], capture_output=True, text=True,
                             check=True).stdout
    line = next(x for x in out.splitlines() if "REG:" in x)
    fields = dict(item.split(":") for item in line.split() if ":" in item)
    return {"regs": int(fields["REG"]), "stack": int(fields["STACK"]), "local": int(fields["LOCAL"])}


def main():
    target = GPUTarget("cuda", 90, 32)
    V = 151936
    results = []
    for dtype in ("bf16", "fp32"):
        block, warps = tk.launch_config(V, torch.device("cuda"))  # the defaults a GPU run uses
        variants = [(tk._logprobs_fwd_kernel, {}), (tk._logprobs_bwd_kernel, {})]
        for flags in ((True, True, True, True), (False, False, False, True), (False, False, False, False)):
            names = ("HAS_TEACHER", "HAS_REF", "HAS_DUAL", "WRITE_GRAD")
            variants.append((tk._policy_loss_kernel, dict(zip(names, flags, strict=True))))
        for fn, consts in variants:
            consts = dict(consts, BLOCK_V=block)
            kernel = triton.compile(ASTSource(fn=fn, signature=signature(fn, dtype), constexprs=consts),
                                    target=target, options={"num_warps": warps})
            res = resources(kernel.asm["cubin"])
            results.append({"kernel": fn.__name__, "dtype": dtype, "block_v": block, "num_warps": warps,
                            "flags": {k: v for k, v in consts.items() if k != "BLOCK_V"}, **res})
    json.dump(results, sys.stdout)


if __name__ == "__main__":
    main()
