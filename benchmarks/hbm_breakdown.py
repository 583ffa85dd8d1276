"""Where a compiled train step's HBM bytes go: its largest kernels by bytes accessed, grouped by kind.

Compiles an experiment's real train step for a TPU slice's topology as `trm compile-check` does (libtpu,
no TPU needed), keeps the optimised HLO text, and attributes XLA's "bytes accessed" to the HLO's top-level
instructions (fusions, copies, custom calls, collectives...). An instruction's bytes are counted here as
XLA's cost analysis counts a kernel's: every operand read once and the result written once, at each array's
size in HBM (with the TPU layout's tile padding), a loop's body once. The total is printed beside XLA's own
figure for comparison (fusions whose operands are sliced inside read less): 96%, 94% and 98% of it for the
baseline as it was, after its MLP-T's leading-axis contraction and after its fused MLP-T kernel. A Pallas
kernel (a tpu_custom_call) is in XLA's total with the bytes it declares (trm/model/mlp_t_kernel.py: its
operands read once and its results written once, as counted here).

    .venv/bin/python benchmarks/hbm_breakdown.py exp01c [--accelerator v4-64] [--set KEY=VALUE ...]
        [--hlo results/hlo/exp01c.txt] [--top 40]

--hlo FILE keeps the compiled HLO (and XLA's totals, in FILE.json) and reads them from there on the next
run, so the attribution can be re-read without the minutes a paper-scale compile takes.
"""

from __future__ import annotations

import argparse
import json
import math
import re
from collections import defaultdict
from pathlib import Path

from trm.config import add_overrides_argument, experiment_path, load_config
from trm.launch.accelerators import ACCELERATORS, accelerator
from trm.launch.compile_check import lowered_steps

DTYPE_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "bf16": 2, "f16": 2}
DTYPE_BYTES |= {"s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8}
# An array shape with its layout: bf16[192,97,512]{2,1,0:T(8,128)(2,1)}
ARRAY = re.compile(r"\b(pred|[subf]\d+|bf16)\[([\d,]*)\](?:\{([^}]*)\})?")
INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.+?) ([a-z][\w\-]*)\((.*)$")
FREE = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id"}
CONTROL = {"while", "conditional", "call"}


def array_bytes(dtype: str, dims: str, layout: str | None) -> int:
    """Bytes of one array in HBM: its dims rounded up to the layout's first tile (TPU pads to tiles)."""
    shape = [int(d) for d in dims.split(",") if d]
    tile = re.search(r"T\(([\d,]+)\)", layout or "")
    if tile and shape:
        order = [int(d) for d in layout.split(":")[0].split(",") if d]  # minor-to-major
        sizes = [int(t) for t in tile.group(1).split(",")]
        for dim, size in zip(order, reversed(sizes), strict=False):
            shape[dim] = -(-shape[dim] // size) * size
    return math.prod(shape) * DTYPE_BYTES.get(dtype, 4)


def shape_bytes(text: str, *, on_chip: bool | None = None) -> int:
    """Bytes of the arrays in a shape text; on_chip True/False: only those in another memory space than HBM
    (a layout with S(n): on a v4, prefetched into on-chip memory) / only those in HBM."""
    return sum(
        array_bytes(*m.groups())
        for m in ARRAY.finditer(text)
        if on_chip is None or on_chip == bool(re.search(r"S\(\d+\)", m.group(3) or ""))
    )


def parse(hlo: str) -> dict[str, list[dict]]:
    """Computations by name: their instructions (name, shape text, opcode, operand names, attributes)."""
    computations, current = {}, None
    for line in hlo.splitlines():
        if line and not line.startswith(" ") and line.rstrip().endswith("{"):
            current = computations.setdefault(re.sub(r"^ENTRY ", "", line).split()[0].lstrip("%"), [])
            if line.startswith("ENTRY"):
                computations["__entry__"] = current
            continue
        match = INSTRUCTION.match(line) if current is not None else None
        if match:
            name, shape, opcode, rest = match.groups()
            operands = re.findall(r"%([\w.\-]+)", rest.split("), ")[0])
            current.append({"name": name, "shape": shape, "op": opcode, "operands": operands, "line": line})
    return computations


def kernels(computations: dict[str, list[dict]]) -> list[dict]:
    """Every top-level kernel reached from the entry (through while bodies, conditionals and calls, once each)."""
    shapes = {i["name"]: i["shape"] for body in computations.values() for i in body}
    found, seen = [], set()

    def walk(name: str, where: str) -> None:
        if name in seen or name not in computations:
            return
        seen.add(name)
        for inst in computations[name]:
            if inst["op"] in CONTROL:
                for called in re.findall(
                    r"(?:body|condition|to_apply|branch_computations)=\{?%?([\w.\-]+)", inst["line"]
                ):
                    walk(called, inst["name"])
                for called in re.findall(r"branch_computations=\{([^}]*)\}", inst["line"]):
                    for branch in called.split(","):
                        walk(branch.strip().lstrip("%"), inst["name"])
                continue
            if inst["op"] in FREE:
                continue
            if inst["op"].endswith("-done"):
                continue  # an async pair (slice-start/-done, copy-start/-done) moves its bytes once
            operands = dict.fromkeys(inst["operands"])  # each operand read once
            read = sum(shape_bytes(shapes.get(o, "")) for o in operands)
            written = shape_bytes(inst["shape"])
            on_chip = sum(shape_bytes(shapes.get(o, ""), on_chip=True) for o in operands)
            on_chip += shape_bytes(inst["shape"], on_chip=True)
            if inst["op"] in ("slice", "slice-start", "copy-start", "dynamic-slice"):
                # reads what it writes: the result (of a start: the second element of its tuple)
                arrays = ARRAY.findall(inst["shape"])
                source = (
                    arrays[0]
                    if inst["op"].endswith("-start")
                    else ARRAY.findall(shapes.get(inst["operands"][0], ""))[0]
                )
                result = arrays[1] if inst["op"].endswith("-start") else arrays[0]
                read = written = array_bytes(*result)
                on_chip = sum(written for array in (source, result) if "S(" in (array[2] or ""))
            source = re.search(r'op_name="([^"]*)"', inst["line"])
            source = source.group(1).replace("jit(_step)/", "").replace("shard_map/", "") if source else ""
            found.append(
                {
                    **inst,
                    "bytes": read + written,
                    "on_chip": on_chip,
                    "read": read,
                    "written": written,
                    "where": where,
                    "kind": kind(inst, computations),
                    "source": source,
                }
            )

    walk("__entry__", "entry")
    return found


def kind(inst: dict, computations: dict[str, list[dict]]) -> str:
    """What a kernel does, from the ops inside it (a fusion) or its own opcode."""
    if inst["op"] != "fusion":
        return inst["op"]
    called = re.search(r"calls=%?([\w.\-]+)", inst["line"])
    body = computations.get(called.group(1), []) if called else []
    ops = {i["op"] for i in body}
    if ops & {"convolution", "dot"}:
        return "matmul fusion"
    if "transpose" in ops or ("copy" in ops and len(ops - {"parameter", "copy", "bitcast"}) == 0):
        return "transpose/copy fusion"
    if ops & {"reduce", "reduce-window"}:
        return "reduction fusion"
    if ops & {"scatter", "gather", "dynamic-slice", "dynamic-update-slice"}:
        return "gather/scatter/slice fusion"
    return "elementwise fusion"


def passes(k: dict) -> str:
    """Which part of the step a kernel belongs to, from the JAX operation it came from."""
    source = k["source"]
    if "transpose(" in source:
        return "backward (transpose of the differentiated recursion)"
    if "jvp(" in source:
        return (
            "forward: the 21 net calls, heads, loss (all traced under jvp; what the backward needs is saved)"
        )
    if source:
        return "outside the differentiated function: optimizer, EMA, ACT bookkeeping"
    return "(no JAX operation: layout copies, prefetches)"


def compiled_hlo(args: argparse.Namespace) -> tuple[str, dict]:
    """The train step's optimised HLO text and XLA's totals: from --hlo FILE when kept there, else compiled."""
    path = Path(args.hlo) if args.hlo else None
    if path is not None and path.exists():
        return path.read_text(), json.loads(path.with_suffix(path.suffix + ".json").read_text())
    config = load_config(experiment_path(args.experiment), args.overrides)
    compiled = lowered_steps(config, accelerator(args.accelerator)).train.compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    memory = compiled.memory_analysis()
    totals = {
        "flops": float(cost.get("flops", 0.0)),
        "bytes_accessed": float(cost.get("bytes accessed", 0.0)),
        "temp_bytes": memory.temp_size_in_bytes,
        "argument_bytes": memory.argument_size_in_bytes,
        "micro_batches": config["train"]["micro_batches"],
    }
    hlo = compiled.as_text()
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(hlo)
        path.with_suffix(path.suffix + ".json").write_text(json.dumps(totals, indent=1) + "\n")
    return hlo, totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("experiment")
    parser.add_argument("--accelerator", default="v4-64", choices=list(ACCELERATORS))
    add_overrides_argument(parser)
    parser.add_argument("--hlo", metavar="FILE", help="keep (or reuse) the compiled HLO text here")
    parser.add_argument("--top", type=int, default=40, help="how many of the largest kernels to list")
    args = parser.parse_args()
    hlo, totals = compiled_hlo(args)
    found = kernels(parse(hlo))
    counted = sum(k["bytes"] for k in found)
    chip = accelerator(args.accelerator)
    print(
        f"{args.experiment} train step on a {args.accelerator}, per chip: XLA counts "
        f"{totals['bytes_accessed'] / 1e9:.1f} GB accessed ({1e3 * totals['bytes_accessed'] / chip.hbm_bytes_per_second:.0f} ms "
        f"at {chip.hbm_bytes_per_second / 1e12:.1f} TB/s), {totals['flops'] / 1e12:.2f} TFLOP; "
        f"temporaries {totals['temp_bytes'] / 2**30:.2f} GiB"
    )
    if totals.get("micro_batches", 1) > 1:
        print(
            f"(per micro-batch: the step runs the loop body {totals['micro_batches']} times; compile-check"
            " multiplies these figures by that, this attribution counts the body once)"
        )
    on_chip = sum(k["on_chip"] for k in found)
    print(
        f"counted here over {len(found)} kernels: {counted / 1e9:.1f} GB, of which {on_chip / 1e9:.1f} GB read"
        f" from or written to arrays the compiler placed in on-chip memory (layout S(n)) rather than HBM\n"
    )
    by_kind = defaultdict(lambda: [0, 0])
    for k in found:
        by_kind[k["kind"]][0] += k["bytes"]
        by_kind[k["kind"]][1] += 1
    print(f"{'kind':32} {'GB':>7} {'share':>6} {'kernels':>8}")
    for name, (total, count) in sorted(by_kind.items(), key=lambda kv: -kv[1][0]):
        print(f"{name:32} {total / 1e9:7.2f} {100 * total / counted:5.1f}% {count:8d}")
    for title, key in (("pass", passes), ("JAX operation", lambda k: k["source"] or "(none)")):
        groups = defaultdict(lambda: [0, 0])
        for k in found:
            groups[key(k)][0] += k["bytes"]
            groups[key(k)][1] += 1
        print(f"\nby {title}:")
        for name, (total, count) in sorted(groups.items(), key=lambda kv: -kv[1][0])[: args.top]:
            print(f"{total / 1e9:7.2f} GB {100 * total / counted:5.1f}% {count:5d}  {name}")
    print(f"\nthe {args.top} largest kernels (GB read + written; result shape):")
    for k in sorted(found, key=lambda k: -k["bytes"])[: args.top]:
        shape = re.sub(r"\{[^}]*\}", "", k["shape"])
        print(
            f"{k['bytes'] / 1e9:6.3f} GB ({k['read'] / 1e9:.3f} r + {k['written'] / 1e9:.3f} w) "
            f"{k['kind']:24} {k['name']:28} {shape[:50]}  {k['source'][:60]}"
        )


if __name__ == "__main__":
    main()
