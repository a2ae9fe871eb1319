"""Run the serialized program (``model.pte``) on the host, instruction by instruction.

What ``etforge verify`` proves must be about the file the user flashes, so this reads it with
ExecuTorch's own deserializer and does what the device runtime does with it: every planned
tensor lives at its planned offset inside one buffer per memory id (an overlapping plan
corrupts values here as it would on the device), constants come from the program's constant
data, kernel calls run each operator's reference implementation (``runtime.execution.pte_ops``), and
delegate calls unpack etforge's payload and run the partition in LiteRT. Moves, frees and
conditional jumps follow the execution plan's chain.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from etforge.core.common.errors import EtforgeError
from etforge.core.graph import layout
from etforge.core.litert import payload
from etforge.core.serialize.pte_check import load_program
from etforge.runtime.execution import litert_run
from etforge.runtime.execution.pte_ops import Kernel, kernel

_MEMORY_FORMATS = {
    0: torch.contiguous_format,
    1: torch.preserve_format,
    2: torch.channels_last,
    3: torch.channels_last_3d,
}


@dataclass(frozen=True)
class TensorSpec:
    """A serialized tensor: where its bytes live and how they are laid out."""

    dtype: torch.dtype
    sizes: tuple[int, ...]
    strides: tuple[int, ...]
    mem_id: int | None  # planned in this memory id's buffer (None: constant or unplanned)
    offset: int
    constant: int  # index into the program's constant buffers (0: none)

    @property
    def nbytes(self) -> int:
        numel = 1
        for s in self.sizes:
            numel *= s
        return numel * _itemsize(self.dtype)


@dataclass(frozen=True)
class _Ref:
    """A list value whose items are other values (IntList, TensorList, OptionalTensorList)."""

    items: tuple[int, ...]


@dataclass(frozen=True)
class Step:
    """One instruction of the plan, as the interpreter runs it."""

    index: int
    kind: str  # kernel | delegate | move | free | jump
    name: str  # operator ("aten::convolution.out"), delegate, or the instruction kind
    args: tuple[int, ...]


#: ``trace`` callback: (step, values read, (index, value) written), copies taken at that moment.
Trace = Callable[[Step, list[Any], list[tuple[int, Any]]], None]
IO = tuple[tuple[int, ...], tuple[int, ...]]


class PteInterpreter:
    """A loaded program; ``run`` executes its method on one set of inputs."""

    def __init__(self, data: bytes, source: str = "model.pte", method: str = "forward") -> None:
        from executorch.exir import schema

        self.source = source
        self._schema = schema
        self.program = load_program(Path(source), data)
        plans = {p.name: p for p in self.program.execution_plan}
        if method not in plans:
            raise EtforgeError(f"{source}: no method {method!r} (has {', '.join(plans)})")
        self.plan = plans[method]
        self.arena_sizes = [int(b) for b in self.plan.non_const_buffer_sizes]
        self.specs: dict[int, TensorSpec] = {}
        self.initial: list[Any] = [self._value(i, v.val) for i, v in enumerate(self.plan.values)]
        self.constants = {i: self._constant(s) for i, s in self.specs.items() if s.constant}
        self.kernels: list[Kernel] = []  # resolved on first run: loading needs no torch ops
        self._io: dict[int, IO] = {}
        self._views: dict[int, int] | None = None
        self.steps = self._steps()

    # -- loading -------------------------------------------------------------------------

    def _value(self, index: int, val: Any) -> Any:
        s = self._schema
        if isinstance(val, s.Tensor):
            self.specs[index] = self._tensor_spec(index, val)
            return None  # materialised per run
        if isinstance(val, s.Int):
            return int(val.int_val)
        if isinstance(val, s.Bool):
            return bool(val.bool_val)
        if isinstance(val, s.Double):
            return float(val.double_val)
        if isinstance(val, s.String):
            return str(val.string_val)
        if isinstance(val, s.Null):
            return None
        if isinstance(val, (s.IntList, s.TensorList, s.OptionalTensorList)):
            return _Ref(tuple(int(i) for i in val.items))
        if isinstance(val, (s.DoubleList, s.BoolList)):
            return list(val.items)
        raise EtforgeError(f"{self.source}: value {index} has an unsupported kind {type(val).__name__}")

    def _tensor_spec(self, index: int, t: Any) -> TensorSpec:
        from executorch.exir.scalar_type import ScalarType
        from executorch.exir.tensor import get_scalar_type, stride_from_dim_order

        dtype = get_scalar_type(ScalarType(int(t.scalar_type)))
        sizes = tuple(int(x) for x in t.sizes)
        strides = tuple(int(x) for x in stride_from_dim_order(list(sizes), [int(d) for d in t.dim_order]))
        alloc = t.allocation_info
        spec = TensorSpec(
            dtype,
            sizes,
            strides,
            int(alloc.memory_id) if alloc is not None else None,
            int(alloc.memory_offset) if alloc is not None else 0,
            int(t.data_buffer_idx),
        )
        if spec.mem_id is not None:
            where = f"{self.source}: tensor value {index}"
            if not 0 < spec.mem_id < len(self.arena_sizes):
                raise EtforgeError(f"{where} is planned in memory id {spec.mem_id}, which has no buffer")
            if spec.offset + spec.nbytes > self.arena_sizes[spec.mem_id]:
                raise EtforgeError(
                    f"{where} ({spec.nbytes} B at offset {spec.offset}) lies outside memory id "
                    f"{spec.mem_id} ({self.arena_sizes[spec.mem_id]} B)"
                )
            if spec.offset % _itemsize(dtype):
                raise EtforgeError(f"{where} is misaligned (offset {spec.offset}, {dtype})")
        return spec

    def _constant(self, spec: TensorSpec) -> torch.Tensor:
        buffers = self.program.constant_buffer
        if spec.constant >= len(buffers):
            raise EtforgeError(f"{self.source}: constant buffer {spec.constant} is missing")
        raw = bytes(buffers[spec.constant].storage)[: spec.nbytes]
        if len(raw) < spec.nbytes:
            raise EtforgeError(f"{self.source}: constant buffer {spec.constant} is truncated")
        storage = (
            torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        )
        return _place(storage, 0, spec)

    def _steps(self) -> list[Step]:
        s = self._schema
        steps = []
        for i, ins in enumerate(self.plan.chains[0].instructions):
            a = ins.instr_args
            if isinstance(a, s.KernelCall):
                op = self.plan.operators[a.op_index]
                name = f"{op.name}.{op.overload}" if op.overload else op.name
                steps.append(Step(i, "kernel", name, tuple(a.args)))
            elif isinstance(a, s.DelegateCall):
                d = self.plan.delegates[a.delegate_index]
                steps.append(Step(i, "delegate", f"{d.id}#{a.delegate_index}", tuple(a.args)))
            elif isinstance(a, s.MoveCall):
                steps.append(Step(i, "move", "move", (a.move_from, a.move_to)))
            elif isinstance(a, s.FreeCall):
                steps.append(Step(i, "free", "free", (a.value_index,)))
            elif isinstance(a, s.JumpFalseCall):
                steps.append(Step(i, "jump", "jump_false", (a.cond_value_index,)))
            else:
                raise EtforgeError(f"{self.source}: instruction {i} has an unknown kind {type(a).__name__}")
        return steps

    # -- running -------------------------------------------------------------------------

    def _materialise(self, planned: bool) -> list[Any]:
        """Every value for one run: planned tensors as views into one buffer per memory id
        (``planned=False``: each in its own storage, the reference a plan is checked against)."""
        values = list(self.initial)
        arenas = [torch.zeros(n, dtype=torch.uint8) for n in self.arena_sizes]
        aliases = {} if planned else self.views()
        for i, spec in self.specs.items():
            if spec.constant:
                values[i] = self.constants[i]
            elif spec.mem_id is not None and planned:
                values[i] = _place(arenas[spec.mem_id], spec.offset, spec)
            elif i not in aliases:
                values[i] = _place(torch.zeros(spec.nbytes, dtype=torch.uint8), 0, spec)
        for view, base in aliases.items():  # a view keeps sharing its base's bytes
            b = self.specs[base]
            values[view] = _place(values[base], self.specs[view].offset - b.offset, self.specs[view])
        return values

    def views(self) -> dict[int, int]:
        """Planned tensors no instruction writes that lie inside one that is written before
        they are read: views sharing their base's memory (ExecuTorch plans ``view`` outputs
        onto the base's bytes and emits no instruction). Maps view -> base."""
        if self._views is not None:
            return self._views
        written: dict[int, int] = {}
        first_read: dict[int, int] = {}
        for step in self.steps:
            reads, writes = self.io(step)
            for v in reads:
                first_read.setdefault(v, step.index)
            for v in writes:
                written.setdefault(v, step.index)
        inputs = set(self.plan.inputs)
        views = {}
        for v, r in first_read.items():
            spec = self.specs.get(v)
            if spec is None or spec.mem_id is None or v in written or v in inputs:
                continue
            bases = [
                (w, b)
                for b, w in written.items()
                if w < r
                and (o := self.specs.get(b)) is not None
                and o.mem_id == spec.mem_id
                and o.offset <= spec.offset
                and spec.offset + spec.nbytes <= o.offset + o.nbytes
            ]
            if bases:
                views[v] = max(bases)[1]
        self._views = views
        return views

    def run(
        self,
        inputs: Sequence[torch.Tensor],
        kernels: str = "default",
        planned: bool = True,
        trace: Trace | None = None,
    ) -> list[Any]:
        """The method's outputs for ``inputs`` (copies, in the program's dim order)."""
        if not self.kernels:
            self.kernels = [kernel(o.name, o.overload) for o in self.plan.operators]
            self.check_dim_orders()
        values = self._materialise(planned)
        tensor_inputs = [i for i in self.plan.inputs if i in self.specs]
        if len(tensor_inputs) != len(inputs):
            raise EtforgeError(
                f"{self.source}: the program takes {len(tensor_inputs)} inputs, got {len(inputs)}"
            )
        for i, x in zip(tensor_inputs, inputs, strict=True):
            if tuple(x.shape) != self.specs[i].sizes:
                raise EtforgeError(
                    f"{self.source}: input shape {list(x.shape)} != planned {list(self.specs[i].sizes)}"
                )
            values[i].copy_(x)
        pc, executed = 0, 0
        limit = 1000 * max(1, len(self.steps))
        with torch.no_grad():
            while pc < len(self.steps):
                executed += 1
                if executed > limit:
                    raise EtforgeError(
                        f"{self.source}: the plan did not terminate after {limit} instructions"
                    )
                pc = self._execute(self.steps[pc], values, kernels, trace)
        return [_snap(_resolve(values, i)) for i in self.plan.outputs]

    def check_dim_orders(self) -> None:
        """Every kernel call's tensors in dim orders the device's C++ kernel accepts and computes
        right (each CPU backend's ``dim_order_problem``): torch's kernels take any strides,
        ExecuTorch's portable and CMSIS-NN kernels refuse or miscompute some, so a host run
        alone would pass a program the device refuses."""
        from etforge.core.contracts.cpu_backend import KernelArg
        from etforge.runtime.execution.cpu_libraries import dim_order_problem

        if not self.kernels:
            self.kernels = [kernel(o.name, o.overload) for o in self.plan.operators]
        for step in self.steps:
            if step.kind != "kernel":
                continue
            ins = self.plan.chains[0].instructions[step.index].instr_args
            op = self.plan.operators[ins.op_index]
            schema_args = self.kernels[ins.op_index].schema.arguments
            args: list[KernelArg] = []
            for i, a in zip(ins.args[: len(schema_args)], schema_args, strict=True):
                value = self.initial[i] if i >= 0 else None
                items = value.items if isinstance(value, _Ref) else (i,)
                for t in items:
                    spec = self.specs.get(t)
                    if spec is not None:
                        order = tuple(int(d) for d in self.plan.values[t].val.dim_order)
                        args.append(KernelArg(a.name, spec.sizes, order, bool(a.is_out)))
            why = dim_order_problem(str(op.name), args)
            if why is not None:
                raise EtforgeError(
                    f"{self.source}: instruction {step.index} ({step.name}) would fail or compute "
                    f"other values on the device: {why}"
                )

    def io(self, step: Step) -> IO:
        """(values the instruction reads, values it writes): a kernel's out arguments and a
        delegate's outputs are written, not read."""
        cached = self._io.get(step.index)
        if cached is not None:
            return cached
        ins = self.plan.chains[0].instructions[step.index].instr_args
        if step.kind == "kernel":
            schema_args = self.kernels[ins.op_index].schema.arguments
            n = len(schema_args)
            reads = tuple(i for i, a in zip(ins.args[:n], schema_args, strict=True) if not a.is_out)
            io: IO = (reads, tuple(ins.args[n:]))
        elif step.kind == "delegate":
            n_in = self._delegate_inputs(ins)
            io = (tuple(ins.args[:n_in]), tuple(ins.args[n_in:]))
        elif step.kind == "move":
            io = ((ins.move_from,), (ins.move_to,))
        else:
            io = (step.args, ())
        self._io[step.index] = io
        return io

    def _execute(self, step: Step, values: list[Any], kernels: str, trace: Trace | None) -> int:
        ins = self.plan.chains[0].instructions[step.index].instr_args
        read = [_snap(_resolve(values, i)) for i in self.io(step)[0]] if trace is not None else []
        nxt = step.index + 1
        try:
            if step.kind == "kernel":
                self._kernel(ins, values)
            elif step.kind == "delegate":
                self._delegate(ins, values, kernels)
            elif step.kind == "move":
                values[ins.move_to] = values[ins.move_from]
            elif step.kind == "jump" and not bool(_resolve(values, ins.cond_value_index)):
                nxt = int(ins.destination_instruction)
        except EtforgeError:
            raise
        except Exception as exc:
            raise EtforgeError(
                f"{self.source}: instruction {step.index} ({step.name}) failed on the host: "
                f"{type(exc).__name__}: {exc}"
            ) from None
        if trace is not None:
            trace(step, read, [(i, _snap(_resolve(values, i))) for i in self.io(step)[1]])
        return nxt

    def _kernel(self, ins: Any, values: list[Any]) -> None:
        k = self.kernels[ins.op_index]
        schema_args = k.schema.arguments
        n = len(schema_args)
        args = [_typed(_resolve(values, i), a.type) for i, a in zip(ins.args[:n], schema_args, strict=True)]
        returns = list(ins.args[n:])
        if k.name == "executorch_prim::et_view.default":
            self._view(args[0], returns[0], values)
            return
        outs = [a for a, s in zip(args, schema_args, strict=True) if s.is_out and isinstance(a, torch.Tensor)]
        pointers = [o.data_ptr() for o in outs]
        result = k(args)
        if [o.data_ptr() for o in outs] != pointers:
            raise EtforgeError(f"{self.source}: {k.name} reallocated its planned output (size mismatch)")
        results = list(result) if isinstance(result, (tuple, list)) else [result]
        for idx, value in zip(returns, results, strict=False):
            current = values[idx]
            if isinstance(current, torch.Tensor) and isinstance(value, torch.Tensor):
                if current.data_ptr() != value.data_ptr() or current.stride() != value.stride():
                    current.copy_(value)
            else:
                values[idx] = value

    def _view(self, source: torch.Tensor, out: int, values: list[Any]) -> None:
        """``et_view``: the output shares the input's memory (no copy), as on the device."""
        spec = self.specs[out]
        values[out] = torch.empty(0, dtype=source.dtype).set_(
            source.untyped_storage(), source.storage_offset(), spec.sizes, spec.strides
        )

    def _blob(self, ins: Any) -> payload.Blob:
        from executorch.exir.schema import DataLocation

        d = self.plan.delegates[ins.delegate_index]
        where = f"{self.source}: delegate {ins.delegate_index} ({d.id})"
        if d.processed.location != DataLocation.INLINE:
            raise EtforgeError(f"{where}: its payload is not in the program")
        raw = bytes(self.program.backend_delegate_data[d.processed.index].data)
        try:
            blob = payload.unpack_for_host(raw)
        except (ValueError, KeyError, UnicodeDecodeError, struct.error):
            raise EtforgeError(
                f"{where}: the payload is not an etforge LiteRT partition (device code such as "
                "NeutronBackend microcode runs on the NPU only): cannot run it on the host"
            ) from None
        if not blob.format.startswith("litert"):
            raise EtforgeError(
                f"{where}: partition {blob.partition} carries {blob.format!r} NPU microcode, which "
                "runs on the device only: cannot run it on the host"
            )
        return blob

    def _delegate_inputs(self, ins: Any) -> int:
        return len(litert_run._interpreter(self._blob(ins).data, "default").get_input_details())

    def _delegate(self, ins: Any, values: list[Any], kernels: str) -> None:
        blob = self._blob(ins)
        where = f"{self.source}: delegate {ins.delegate_index} (partition {blob.partition})"
        n_in = self._delegate_inputs(ins)
        args = [_resolve(values, i) for i in ins.args]
        ins_t, outs_t = args[:n_in], args[n_in:]
        orders = blob.header.get("input_dim_orders") or [list(range(a.dim())) for a in ins_t]
        stored = [a.permute(o).contiguous().numpy() for a, o in zip(ins_t, orders, strict=True)]
        results = litert_run.run(blob.data, stored, kernels)
        out_orders = blob.header.get("output_dim_orders") or [list(range(r.ndim)) for r in results]
        if len(results) != len(outs_t):
            raise EtforgeError(
                f"{where}: LiteRT returns {len(results)} outputs, the program has {len(outs_t)}"
            )
        for out, r, o in zip(outs_t, results, out_orders, strict=True):
            out.copy_(torch.from_numpy(r).permute(layout.inverse(o)))


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def _place(storage: torch.Tensor, offset: int, spec: TensorSpec) -> torch.Tensor:
    """A tensor of ``spec``'s dtype, sizes and dim order over ``storage`` bytes at ``offset``."""
    return torch.empty(0, dtype=spec.dtype).set_(
        storage.untyped_storage(), offset // _itemsize(spec.dtype), spec.sizes, spec.strides
    )


def _resolve(values: list[Any], index: int) -> Any:
    if index < 0:
        return None
    v = values[index]
    if isinstance(v, _Ref):
        return [_resolve(values, i) for i in v.items]
    return v


def _typed(value: Any, arg_type: Any) -> Any:
    """Enums travel as ints in a program: back to the torch objects the schema wants."""
    name = str(arg_type).removesuffix("?")
    if not isinstance(value, int) or isinstance(value, bool):
        return value
    if name == "ScalarType":
        from executorch.exir.scalar_type import ScalarType
        from executorch.exir.tensor import get_scalar_type

        return get_scalar_type(ScalarType(value))
    if name == "MemoryFormat":
        return _MEMORY_FORMATS[value]
    if name == "Layout":
        return torch.strided
    return value


def _snap(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.clone()
    if isinstance(value, list):
        return [_snap(v) for v in value]
    return value
