"""Does a text's vector depend on what it is encoded with? MiniLM variants, alone and in padded batches.

``python -m bench.ltm_eval.models.batch_invariance [--make] [VARIANT ...]`` in the kit's venv (ship.sh's), after
ship.sh (which leaves the fp32 export at ``SCRATCH/models/ship/model.onnx``). ``--make`` writes the variants below
beside it first; ``--evaluate VARIANT`` runs ``bench.ltm_eval.evaluate`` with that file in place of the shipped
model instead. Vectors come from ``bench.ltm_eval.sharing.batched_vectors`` (a lone text: a run of one, no
padding) on convmem's ``Encoder`` loading the variant.
For each variant, with the encoder's session options (one intra-op thread):

- the largest ``1 - cosine`` between a text's unit vector encoded alone (no padding) and the same text's inside
  padded, masked runs of 2 to 8 texts of other lengths (the 266 labelled queries and 64 memories, in shuffled
  groups; the seed is printed), and whether every vector came out bitwise equal;
- the cost per hint of the labelled queries one per run and 8 per run (best of ``--repeat`` blocks);
- the smallest cosine of a query's vector to fp32's.

A variant is batch-invariant when no statistic of its activations spans two rows (quantised by row, by a fixed
scale, or not at all): the masked padding of a neighbour then changes nothing of a text's rows.
"""

from __future__ import annotations

import argparse
import random
import shutil
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from bench.ltm_eval.models.paths import MODELS
from bench.ltm_eval.sharing import batched_vectors, best_ms
from convmem.logstore.memories.encoder import MAX_TOKENS, MODEL_DIR, MODEL_FILE, TOKENIZER_FILE, Encoder

Vectors = npt.NDArray[np.float32]
WORK = MODELS / "ship"
FP32 = "model.onnx"
#: variant file -> how it is made from the fp32 export (see make()).
VARIANTS: dict[str, str] = {
    "minilm-l6-v2-int8pc.onnx": "dynamic int8, per channel (what ship.sh makes; one activation scale per run)",
    "nbits8-b32-acc4.onnx": "weight-only int8 MatMulNBits, block 32, accuracy_level 4 (int8 activations by row block)",
    "nbits8-b128-acc4.onnx": "weight-only int8 MatMulNBits, block 128, accuracy_level 4",
    "nbits8-b32-acc0.onnx": "weight-only int8 MatMulNBits, block 32, accuracy_level 0 (fp32 compute)",
    "nbits8-b64-acc4.onnx": "weight-only int8 MatMulNBits, block 64, accuracy_level 4",
    "rowasym-int8pc.onnx": "int8 weights per channel, activations quantised per row (uint8, min/max), plain ONNX ops",
    "static-minmax.onnx": "static QDQ int8 (weights per channel, activations per tensor, min/max over the memories)",
    "static-minmax-wmm.onnx": "the same, the MatMuls by a weight only (the attention's two products stay fp32)",
}


def make_nbits(src: Path, dst: Path, block: int, accuracy: int) -> None:
    """Weight-only int8 (round to nearest, symmetric, blocks of ``block`` along K) of every MatMul by a weight."""
    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import DefaultWeightOnlyQuantConfig, MatMulNBitsQuantizer

    cfg = DefaultWeightOnlyQuantConfig(block_size=block, is_symmetric=True, accuracy_level=accuracy, bits=8)
    q = MatMulNBitsQuantizer(onnx.load(str(src)), algo_config=cfg)
    q.process()
    q.model.save_model_to_file(str(dst), use_external_data_format=False)


def make_per_row(src: Path, dst: Path) -> None:
    """Every MatMul by a weight becomes an integer MatMul of int8 weights (symmetric, one scale per output
    column) by the activations quantised row by row to uint8 (one scale and zero point per token, from the row's
    min and max), the int32 product scaled back to float: no statistic spans two rows, so a token's output
    does not depend on the other rows of the run. An input feeding several MatMuls (Q, K, V) is quantised once.
    """
    import onnx
    from onnx import helper, numpy_helper

    m = onnx.load(str(src))
    g = m.graph
    inits = {i.name: i for i in g.initializer}
    nodes: list[Any] = []
    new_inits: list[Any] = []
    quantised: dict[str, tuple[str, str, str]] = {}  # input -> (Xq, row scale, row zero point)

    def const(name: str, value: Any) -> str:
        new_inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    one = const("rq/eps", np.float32(1e-12))
    for n in g.node:
        if n.op_type != "MatMul" or n.input[1] not in inits:
            nodes.append(n)
            continue
        x, w_name = n.input
        w = numpy_helper.to_array(inits[w_name]).astype(np.float32)
        sw = np.maximum(np.abs(w).max(axis=0), 1e-12) / 127.0
        wq = np.clip(np.round(w / sw), -127, 127).astype(np.int8)
        p = f"rq/{n.name or w_name}"
        if x not in quantised:
            q = f"rq/in{len(quantised)}"
            lo, hi, t = f"{q}/min", f"{q}/max", f"{q}/t"
            nodes += [helper.make_node("ReduceMin", [x], [lo + "0"], axes=[-1], keepdims=1),
                      helper.make_node("Min", [lo + "0", const(q + "/zero", np.float32(0))], [lo]),
                      helper.make_node("ReduceMax", [x], [hi + "0"], axes=[-1], keepdims=1),
                      helper.make_node("Max", [hi + "0", q + "/zero"], [hi]),
                      helper.make_node("Sub", [hi, lo], [q + "/range"]),
                      helper.make_node("Div", [q + "/range", const(q + "/255", np.float32(255))], [q + "/s0"]),
                      helper.make_node("Max", [q + "/s0", one], [q + "/s"]),
                      helper.make_node("Div", [lo, q + "/s"], [q + "/nzp"]),
                      helper.make_node("Round", [q + "/nzp"], [q + "/nzpr"]),
                      helper.make_node("Neg", [q + "/nzpr"], [q + "/zp"]),
                      helper.make_node("Div", [x, q + "/s"], [t + "0"]),
                      helper.make_node("Round", [t + "0"], [t + "1"]),
                      helper.make_node("Add", [t + "1", q + "/zp"], [t + "2"]),
                      helper.make_node("Clip", [t + "2", q + "/zero", q + "/255"], [t + "3"]),
                      helper.make_node("Cast", [t + "3"], [q], to=onnx.TensorProto.UINT8)]
            quantised[x] = (q, q + "/s", q + "/zp")
        xq, xs, zp = quantised[x]
        nodes += [helper.make_node("MatMulInteger", [xq, const(p + "/wq", wq)], [p + "/i32"]),
                  helper.make_node("Cast", [p + "/i32"], [p + "/f"], to=onnx.TensorProto.FLOAT)]
        colsum = wq.astype(np.float32).sum(axis=0)  # (xq - zp) @ wq = xq @ wq - zp * column sums of wq
        nodes += [helper.make_node("Mul", [zp, const(p + "/colsum", colsum)], [p + "/corr"]),
                  helper.make_node("Sub", [p + "/f", p + "/corr"], [p + "/fc"]),
                  helper.make_node("Mul", [xs, const(p + "/sw", sw.astype(np.float32))], [p + "/scale"]),
                  helper.make_node("Mul", [p + "/fc", p + "/scale"], [n.output[0]], name=n.name)]
    used = {i for nd in nodes for i in nd.input}
    keep = [i for i in g.initializer if i.name in used]
    del g.node[:]
    g.node.extend(nodes)
    del g.initializer[:]
    g.initializer.extend(keep + new_inits)
    onnx.checker.check_model(m)
    onnx.save(m, str(dst))


def memory_texts() -> list[str]:
    """The labelled memories' texts: the static variant's calibration set (no query: the queries are what the
    quality gate measures), and the first 64 are probed beside the queries."""
    from bench.ltm_eval import memories

    return [f"{d.summary} {d.details}" for d in memories()]


def make_static(src: Path, dst: Path, *, weights_only: bool) -> None:
    """Static QDQ int8 of every MatMul (of those by a weight only if ``weights_only``): weights per channel,
    activations one fixed scale per tensor, from their min and max over :func:`memory_texts`."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(MODEL_DIR / TOKENIZER_FILE))
    tok.enable_truncation(MAX_TOKENS)
    feeds = []
    for t in memory_texts():
        ids = np.asarray([tok.encode(t).ids], dtype=np.int64)
        feeds.append({"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)})

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self.it = iter(feeds)

        def get_next(self) -> dict[str, Any] | None:
            return next(self.it, None)

    pre = dst.with_suffix(".pre.onnx")
    quant_pre_process(str(src), str(pre), skip_symbolic_shape=True)
    g = onnx.load(str(pre)).graph
    weights = {i.name for i in g.initializer}
    products = [n.name for n in g.node if n.op_type == "MatMul" and n.input[1] not in weights]
    quantize_static(str(pre), str(dst), Reader(), quant_format=QuantFormat.QDQ, op_types_to_quantize=["MatMul"],
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax, nodes_to_exclude=products if weights_only else [])


def evaluate(name: str, argv: Sequence[str]) -> int:
    """``python -m bench.ltm_eval.evaluate ARGV`` with the variant ``name`` in place of the shipped model."""
    from bench.ltm_eval import evaluate as ev

    ev._memo[:] = [ev.Memo(encoder(name))]
    return ev.main(list(argv))


def make() -> None:
    src = WORK / FP32
    for name in VARIANTS:
        if name.startswith("row"):
            make_per_row(src, WORK / name)
        if name.startswith("static-"):
            make_static(src, WORK / name, weights_only=name.endswith("-wmm.onnx"))
        if name.startswith("nbits8-"):
            _, b, a = name.removesuffix(".onnx").split("-")
            make_nbits(src, WORK / name, int(b[1:]), int(a[3:]))


def encoder(name: str) -> Encoder:
    """convmem's ``Encoder`` (its session options: one intra-op thread) on the variant file ``name``."""
    d = WORK / ("dir-" + name.removesuffix(".onnx"))
    d.mkdir(exist_ok=True)
    shutil.copyfile(WORK / name, d / MODEL_FILE)
    shutil.copyfile(MODEL_DIR / TOKENIZER_FILE, d / TOKENIZER_FILE)
    return Encoder(d, check_hash=False)


def figures(name: str, texts: list[str], hints: list[str], ref: Vectors, seed: int, repeat: int) -> str:
    m = encoder(name)
    alone = np.concatenate([batched_vectors(m, [t]) for t in texts])
    rng = random.Random(seed)
    worst, bitwise = 0.0, True
    for size in range(2, 9):
        order = list(range(len(texts)))
        rng.shuffle(order)
        for g in range(0, len(order) - size + 1, size):
            idx = order[g: g + size]
            got = batched_vectors(m, [texts[i] for i in idx])
            bitwise = bitwise and bool(np.array_equal(got, alone[idx]))
            worst = max(worst, float((1.0 - (got * alone[idx]).sum(axis=1)).max()))
    groups = [hints[i: i + 8] for i in range(0, len(hints), 8)]
    one = best_ms(lambda: [batched_vectors(m, [h]) for h in hints], repeat, calls=1) / len(hints)
    many = best_ms(lambda: [batched_vectors(m, g) for g in groups], repeat, calls=1) / len(hints)
    cos = float((alone[: len(ref)] * ref).sum(axis=1).min())
    return (f"{name:<26} batched vs alone: max 1-cos {worst:.1e}, bitwise {bitwise}; per hint {one:.3f} ms "
            f"alone, {many:.3f} ms 8 per run; min cos to fp32 {cos:.4f}")


def main(argv: Sequence[str] | None = None) -> int:
    from bench.ltm_eval import queries

    ap = argparse.ArgumentParser(prog="python -m bench.ltm_eval.models.batch_invariance", description=__doc__)
    ap.add_argument("variants", nargs="*", default=[FP32, *VARIANTS])
    ap.add_argument("--make", action="store_true")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--evaluate", metavar="VARIANT", help="run bench.ltm_eval.evaluate with VARIANT instead")
    a = ap.parse_args(argv)
    if a.make:
        make()
    if a.evaluate:
        return evaluate(a.evaluate, [])
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    hints = list(dict.fromkeys(q.text for q in queries()))
    texts = hints + memory_texts()[:64]
    ref = np.concatenate([batched_vectors(encoder(FP32), [t]) for t in hints])
    print(f"seed {seed}; {len(texts)} texts; load average {open('/proc/loadavg').read().split()[0]}")
    for name in a.variants:
        print(figures(name, texts, hints, ref, seed, a.repeat), flush=True)
    print(f"load average {open('/proc/loadavg').read().split()[0]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
