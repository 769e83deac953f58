"""TensorRT backend for engines built by ``export.tensorrt_build`` (``.engine`` / ``.plan`` + ``<engine>.json``), of
either flavour (``tensorrt`` or ``tensorrt-rtx``, not interchangeable). Reading the metadata is light."""

from __future__ import annotations

import collections
import importlib
import json
import threading
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from models.checkpoint import ModelMeta
from models.registry import Row, Table

if TYPE_CHECKING:
    import torch

FLAVOUR_TENSORRT = "tensorrt"
FLAVOUR_RTX = "tensorrt-rtx"
RTX_INSTALL = "pip install tensorrt-rtx-cu13-libs tensorrt-rtx-cu13-bindings"


@dataclass(frozen=True)
class Flavour:
    """A TensorRT flavour: the Python modules that provide it, tried in order, and how to install it."""

    modules: tuple[str, ...]
    install: str


#: The two flavours (the RTX wheels install ``tensorrt_rtx_bindings``; the ``tensorrt-rtx-cu13`` metapackage adds a
#: ``tensorrt_rtx`` module re-exporting it).
TENSORRT_FLAVOURS: Table[Flavour] = Table("TensorRT flavour", [
    Row(FLAVOUR_TENSORRT, "NVIDIA TensorRT: engines built on the GPU that runs them", Flavour(
        ("tensorrt",), "install full TensorRT on the GPU machine (package tensorrt-cu13 or tensorrt-cu12; its "
        "libraries come from NVIDIA's package index, not from PyPI)")),
    Row(FLAVOUR_RTX, "TensorRT for RTX: engines built without a GPU", Flavour(
        ("tensorrt_rtx_bindings", "tensorrt_rtx"), f'{RTX_INSTALL}  (or: pip install "spml[trt]")')),
])
FLAVOURS: tuple[str, ...] = tuple(TENSORRT_FLAVOURS.names())
ENGINE_SIDECAR_FORMAT = "spml-tensorrt-engine"
ENGINE_SUFFIXES: tuple[str, ...] = (".engine", ".plan")

# TensorRT DataType member name -> torch dtype name (names are shared by both flavours)
_TORCH_DTYPES: dict[str, str] = {
    "FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT8": "int8", "UINT8": "uint8", "INT32": "int32",
    "INT64": "int64", "BOOL": "bool"}


class TensorRTRuntimeError(RuntimeError, OSError):
    """No usable GPU / TensorRT runtime for this engine, or the engine failed to run; one readable line (also an
    ``OSError``, which command-line callers report as a one-line error)."""


def import_tensorrt(flavour: str) -> ModuleType:
    """Import the module of ``flavour``; ``ModuleNotFoundError`` naming the install command when it cannot."""
    spec = TENSORRT_FLAVOURS[flavour]  # an unknown flavour: UnknownName (a ValueError) listing them
    problems: list[str] = []
    for name in spec.modules:
        try:
            return importlib.import_module(name)
        except (ImportError, OSError) as exc:  # OSError: the module is there but a shared library is not
            problems.append(f"{name}: {type(exc).__name__}: {exc}")
    raise ModuleNotFoundError(f"{flavour} is not installed ({'; '.join(problems)}); {spec.install}",
                              name=spec.modules[0])


def tensorrt_importable(flavour: str) -> bool:
    """Whether :func:`import_tensorrt` succeeds for ``flavour`` (never raises for a known flavour)."""
    try:
        import_tensorrt(flavour)
    except ModuleNotFoundError:
        return False
    return True


def make_logger(trt: ModuleType, echo: bool = False, keep: int = 200) -> Any:
    """A TensorRT ``ILogger`` that keeps the last ``keep`` warnings and errors (``.errors()``: the error texts);
    ``echo`` also prints them. Keep a reference as long as the builder / runtime that uses it lives."""

    class CollectingLogger(trt.ILogger):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.ILogger.__init__(self)
            self.messages: collections.deque[tuple[Any, str]] = collections.deque(maxlen=keep)

        def log(self, severity: Any, msg: str) -> None:
            if severity <= trt.ILogger.Severity.WARNING:
                self.messages.append((severity, msg))
                if echo:
                    print(f"[TensorRT {severity.name}] {msg}")

        def errors(self) -> list[str]:
            return [m for s, m in self.messages if s <= trt.ILogger.Severity.ERROR]

    return CollectingLogger()


def cuda_target() -> str | None:
    """Compute capability of the current CUDA GPU as ``"sm<major><minor>"`` (e.g. ``"sm90"``), None without one."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability()
    return f"sm{major}{minor}"


def engine_sidecar_path(engine_path: str | Path) -> Path:
    """The sidecar of an engine: ``model.engine`` -> ``model.engine.json`` (appended, not substituted, so that an
    engine beside ``model.onnx`` never overwrites the ONNX export's own ``model.json``)."""
    engine_path = Path(engine_path)
    return engine_path.with_name(engine_path.name + ".json")


def read_engine_sidecar(engine_path: str | Path) -> dict[str, Any]:
    """Load and check the sidecar of ``engine_path`` (``FileNotFoundError`` / ``ValueError`` naming the file)."""
    side = engine_sidecar_path(engine_path)
    if not side.is_file():
        raise FileNotFoundError(f"{side} not found: a TensorRT engine needs the sidecar written next to it by "
                                "`python -m export --trt`")
    try:
        doc = json.loads(side.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{side}: not a readable JSON sidecar ({exc})") from exc
    if not isinstance(doc, dict) or doc.get("format") != ENGINE_SIDECAR_FORMAT:
        raise ValueError(f"{side}: not an spml TensorRT engine sidecar (no '{ENGINE_SIDECAR_FORMAT}' marker)")
    missing = [k for k in ("tensorrt", "meta", "targets", "profile", "input", "output") if k not in doc]
    if missing:
        raise ValueError(f"{side}: sidecar lacks {', '.join(missing)}")
    return doc


def batch_chunks(n: int, min_batch: int, max_batch: int) -> list[tuple[int, int, int]]:
    """Split ``n`` rows into engine calls ``[(start, stop, run_size)]``, ``min_batch <= run_size <= max_batch``; a last
    chunk below the minimum is padded up to ``min_batch`` (``run_size > stop - start``)."""
    if not 1 <= min_batch <= max_batch:
        raise ValueError(f"invalid batch range {min_batch}..{max_batch}")
    chunks = []
    for start in range(0, n, max_batch):
        stop = min(n, start + max_batch)
        chunks.append((start, stop, max(stop - start, min_batch)))
    return chunks


def _engine_io(engine: Any, trt: ModuleType) -> tuple[str, str]:
    names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
    inputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
    outputs = [n for n in names if engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
    if len(inputs) != 1 or len(outputs) != 1:
        raise ValueError(f"expected an engine with one input and one output, got inputs {inputs}, outputs {outputs}")
    return inputs[0], outputs[0]


def _torch_dtype(trt_dtype: Any) -> torch.dtype:
    import torch

    try:
        return getattr(torch, _TORCH_DTYPES[trt_dtype.name])
    except KeyError:
        raise ValueError(f"engine tensor type {trt_dtype.name} has no torch equivalent") from None


def _cuda_device(device: int | str | torch.device | None) -> torch.device:
    """``None`` / ``3`` / ``"cuda:3"`` / ``"tensorrt:3"`` / ``torch.device`` -> a CUDA ``torch.device``."""
    import torch

    if device is None:
        return torch.device("cuda")
    if isinstance(device, int):
        return torch.device("cuda", device)
    text = str(device).strip().lower()
    if text == "tensorrt" or text.startswith("tensorrt:"):
        text = "cuda" + text[len("tensorrt") :]
    try:
        dev = torch.device(text)
    except RuntimeError as exc:
        raise ValueError(f"invalid device {device!r} for a TensorRT engine; use cuda or cuda:N") from exc
    if dev.type != "cuda":
        raise ValueError(f"TensorRT engines run on a CUDA device, not {device!r}; use cuda or cuda:N")
    return dev


def _rtx_invalid_reasons(trt: ModuleType, diagnostics: int) -> list[str]:
    return [name.lower().replace("_", " ") for name, flag in trt.EngineInvalidityDiagnostics.__members__.items()
            if diagnostics & int(flag)]


class TensorRTBackend:
    """A deserialized TensorRT(-RTX) engine on one CUDA GPU: float32 ``(N,3,S,S)`` -> logits ``(N,C)``, through the
    tensor-address API on torch CUDA tensors and its own ``torch.cuda.Stream``."""

    name: ClassVar[str] = "tensorrt"
    suffixes: ClassVar[tuple[str, ...]] = ENGINE_SUFFIXES

    def __init__(self, *, path: Path, meta: ModelMeta, info: dict[str, Any], trt: ModuleType, logger: Any,
                 runtime: Any, engine: Any, context: Any, device: torch.device) -> None:
        self.path = path
        self.meta = meta
        self.info = info
        self.flavour: str = info["tensorrt"]["flavour"]
        self.device = device
        self._logger = logger
        self._runtime = runtime  # the engine must not outlive its runtime
        self._engine = engine
        self._context = context
        self._lock = threading.Lock()  # one execution context: one inference at a time
        self.input_name, self.output_name = _engine_io(engine, trt)
        self.input_dtype = _torch_dtype(engine.get_tensor_dtype(self.input_name))
        self.output_dtype = _torch_dtype(engine.get_tensor_dtype(self.output_name))
        lo, _opt, hi = (tuple(d) for d in engine.get_tensor_profile_shape(self.input_name, 0))
        self.min_batch, self.max_batch = int(lo[0]), int(hi[0])
        import torch

        self.stream = torch.cuda.Stream(device=device)

    @classmethod
    def load(cls, path: str | Path, device: int | str | torch.device | None = None) -> TensorRTBackend:
        """Deserialize the engine ``path`` (with its sidecar) on CUDA ``device`` (default: current); raises
        :class:`TensorRTRuntimeError` when this GPU or TensorRT install cannot run it."""
        import torch

        path = Path(path)
        dev = _cuda_device(device)
        if not path.is_file():
            raise FileNotFoundError(f"engine not found: {path}")
        info = read_engine_sidecar(path)
        meta = cls.read_meta(path)
        flavour = str(info["tensorrt"].get("flavour"))
        if flavour not in FLAVOURS:
            raise ValueError(f"{engine_sidecar_path(path)}: unknown TensorRT flavour {flavour!r}")
        built_with = f"{flavour} {info['tensorrt'].get('version')}"
        if not torch.cuda.is_available():
            raise TensorRTRuntimeError(f"{path}: TensorRT engines run only on an NVIDIA CUDA GPU and torch sees none "
                                       f"here (engine built with {built_with} for {', '.join(info['targets'])}); use "
                                       "the .onnx model instead")
        trt = import_tensorrt(flavour)
        if str(trt.__version__) != str(info["tensorrt"].get("version")):
            raise TensorRTRuntimeError(f"{path}: engine built with {built_with}, but {trt.__name__} {trt.__version__} "
                                       "is installed; engines only load with the exact version that built them: "
                                       "rebuild it with `python -m export --trt`")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        if dev.index >= torch.cuda.device_count():
            raise ValueError(f"no CUDA device {dev}: torch sees {torch.cuda.device_count()} GPU(s)")
        with torch.cuda.device(dev):
            here = cuda_target() or "?"
            gpu = torch.cuda.get_device_name(dev)
            targets = [str(t) for t in info["targets"]]
            explicit = [t for t in targets if t.startswith("sm")]
            if explicit and here not in explicit:
                how = f"--trt-target {here}" if flavour == FLAVOUR_RTX else "on this machine"
                raise TensorRTRuntimeError(f"{path}: engine built for {', '.join(explicit)}, but this GPU ({gpu}) is "
                                           f"{here}; rebuild it for this GPU (`python -m export --trt` {how})")
            data = path.read_bytes()
            logger = make_logger(trt)
            runtime = trt.Runtime(logger)
            if flavour == FLAVOUR_RTX and hasattr(runtime, "get_engine_validity"):
                validity, diagnostics = runtime.get_engine_validity(data)
                if validity == trt.EngineValidity.INVALID:
                    reasons = ", ".join(_rtx_invalid_reasons(trt, int(diagnostics))) or "no reason given"
                    raise TensorRTRuntimeError(f"{path}: TensorRT-RTX cannot run this engine on {gpu} ({here}): "
                                               f"{reasons}" + (f" ({logger.errors()[-1]})" if logger.errors() else ""))
            engine = runtime.deserialize_cuda_engine(data)
            if engine is None:
                detail = logger.errors()[-1] if logger.errors() else "no message"
                raise TensorRTRuntimeError(f"{path}: {trt.__name__} {trt.__version__} could not deserialize the engine "
                                           f"on {gpu} ({here}); engines are tied to the GPU and TensorRT version that "
                                           f"built them ({detail})")
            context = engine.create_execution_context()
            if context is None:
                detail = logger.errors()[-1] if logger.errors() else "out of GPU memory?"
                raise TensorRTRuntimeError(f"{path}: could not create an execution context ({detail})")
            try:
                backend = cls(path=path, meta=meta, info=info, trt=trt, logger=logger, runtime=runtime,
                              engine=engine, context=context, device=dev)
            except ValueError as exc:
                raise ValueError(f"{path}: {exc}") from exc
        size = int(meta.image_size)
        shape = tuple(engine.get_tensor_shape(backend.input_name))
        if len(shape) != 4 or tuple(shape[1:]) != (3, size, size):
            raise ValueError(f"{path}: engine input {backend.input_name} has shape {shape}, expected "
                             f"(-1, 3, {size}, {size})")
        return backend

    @classmethod
    def open(cls, path: str | Path, device: str | None = None,
             threads: int | None = None) -> tuple[TensorRTBackend, str]:
        """:meth:`load` on ``device`` (``threads`` is not used: the engine runs on the GPU); returns the runtime and
        a description of where it runs."""
        return cls.load(path, device=device), cls.name + (f" ({device})" if device else "")

    @classmethod
    def read_meta(cls, path: str | Path) -> ModelMeta:
        """The model metadata of engine ``path``, from its sidecar (no TensorRT, CUDA or torch needed)."""
        info = read_engine_sidecar(path)
        try:
            return ModelMeta.from_json(json.dumps(info["meta"]))
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{engine_sidecar_path(path)}: invalid model metadata ({exc})") from exc

    def predict_logits(self, batch: np.ndarray) -> np.ndarray:
        """float32 ``(N, 3, S, S)`` preprocessed batch -> float32 logits ``(N, C)`` (any ``N``; split as needed)."""
        import torch

        batch = np.ascontiguousarray(batch, dtype=np.float32)
        size, n_cls = int(self.meta.image_size), len(self.meta.classes)
        if batch.ndim != 4 or batch.shape[1:] != (3, size, size):
            raise ValueError(f"expected a batch of shape (N, 3, {size}, {size}), got {batch.shape}")
        if batch.shape[0] == 0:
            return np.zeros((0, n_cls), np.float32)
        outs = []
        with self._lock, torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            for start, stop, run in batch_chunks(batch.shape[0], self.min_batch, self.max_batch):
                chunk = batch[start:stop]
                if run > len(chunk):
                    chunk = chunk[np.arange(run) % len(chunk)]
                outs.append(self._run(chunk)[: stop - start])
        return np.concatenate(outs).astype(np.float32, copy=False)

    def _run(self, chunk: np.ndarray) -> np.ndarray:
        """One engine call on the current (own) stream; the caller holds the lock and the stream context."""
        import torch

        ctx = self._context
        x = torch.from_numpy(chunk).to(self.device).to(self.input_dtype).contiguous()
        if not ctx.set_input_shape(self.input_name, tuple(x.shape)):
            raise TensorRTRuntimeError(f"input shape {tuple(x.shape)} is outside the engine profile "
                                       f"(batch {self.min_batch}..{self.max_batch})")
        out_shape = tuple(ctx.get_tensor_shape(self.output_name))
        if any(d < 0 for d in out_shape):
            raise TensorRTRuntimeError(f"TensorRT could not infer the output shape (got {out_shape})")
        y = torch.empty(out_shape, dtype=self.output_dtype, device=self.device)
        ctx.set_tensor_address(self.input_name, x.data_ptr())
        ctx.set_tensor_address(self.output_name, y.data_ptr())
        if not ctx.execute_async_v3(self.stream.cuda_stream):
            detail = self._logger.errors()[-1] if self._logger.errors() else "no message"
            raise TensorRTRuntimeError(f"{self.path}: TensorRT execution failed ({detail})")
        self.stream.synchronize()
        logits = y.float().cpu().numpy()
        if logits.shape != (len(chunk), len(self.meta.classes)):
            raise TensorRTRuntimeError(f"engine returned logits of shape {logits.shape} for a batch of {len(chunk)} "
                                       f"and {len(self.meta.classes)} classes")
        return logits


def supported_targets(trt: ModuleType) -> list[str]:
    """The compute targets a TensorRT-RTX module can build for, e.g. ``['sm75', 'sm80', ...]`` (empty for full TRT)."""
    enum = getattr(trt, "ComputeCapability", None)
    if enum is None:
        return []
    return [name.lower() for name in enum.__members__ if name.startswith("SM")]


__all__ = [
    "ENGINE_SIDECAR_FORMAT", "ENGINE_SUFFIXES", "FLAVOURS", "FLAVOUR_RTX", "FLAVOUR_TENSORRT", "TensorRTBackend",
    "TensorRTRuntimeError", "batch_chunks", "cuda_target", "engine_sidecar_path", "import_tensorrt", "make_logger",
    "read_engine_sidecar", "supported_targets", "tensorrt_importable"]
