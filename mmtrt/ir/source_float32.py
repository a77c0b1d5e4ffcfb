"""The PyTorch source in float32 only where it runs: `compare` and `eval` hold it in its checkpoint's dtype, and a
7B LLM held in bfloat16 is 13.5 GB, widened whole 27 GB, more than a 24 GB host has; widened a decoder layer at a
time it adds one layer's 0.8 GB.

Each child of a module's outermost ModuleLists (a decoder or encoder layer) is widened by a hook as it is called
and handed its own tensors back when it returns; every other tensor (embeddings, norms, heads) is widened for as
long as the block or the partition's runner lasts. Widening is exact (every bfloat16 or float16 is a float32), so
the outputs are those of the model widened whole."""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from typing import Any, Iterable, Iterator

import torch

from mmtrt.ir.resident import release


@contextmanager
def in_float32(model: torch.nn.Module, available: int | None = None) -> Iterator[None]:
    """`model` in float32 for the block: whole where that takes at most half the memory this host has available
    (a generating model widens each layer once, not once a token), else a layer at a time."""
    import psutil

    available = psutil.virtual_memory().available if available is None else available
    widening = LayerWidening([model], by_layer=2 * float32_bytes(model) > available)
    widening.widen()
    try:
        yield
    finally:
        widening.narrow()


def float32_bytes(model: torch.nn.Module) -> int:
    return 4 * sum(t.numel() for t in _tensors([model]) if t.is_floating_point())


class LayerWidening:
    """Widen `modules` for a runner's activation, their layers each only while it runs (`by_layer`, the default,
    else all at once); `narrow()` undoes all."""

    def __init__(self, modules: list[torch.nn.Module], by_layer: bool = True):
        self._modules = modules
        self._by_layer = by_layer
        self._whole: list[tuple[torch.Tensor, torch.Tensor]] = []
        self._running: dict[int, list[tuple[torch.Tensor, torch.Tensor]]] = {}
        self._hooks: list[Any] = []

    def widen(self) -> None:
        layers = list(_layers(self._modules)) if self._by_layer else []
        self._whole = _widen(_outside(self._modules, layers))
        for layer in layers:
            self._hooks.append(layer.register_forward_pre_hook(self._enter))
            self._hooks.append(layer.register_forward_hook(self._leave))

    def narrow(self) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for own in [self._whole, *self._running.values()]:
            _narrow(own)
        self._whole = []
        self._running.clear()

    def _enter(self, layer: torch.nn.Module, _args) -> None:
        self._running[id(layer)] = _widen(_tensors([layer]))

    def _leave(self, layer: torch.nn.Module, _args, _output) -> None:
        _narrow(self._running.pop(id(layer), []))


def _layers(modules: list[torch.nn.Module]) -> Iterable[torch.nn.Module]:
    """The children of the outermost ModuleLists under `modules`."""
    for module in modules:
        yield from _stack_children(module)


def _stack_children(module: torch.nn.Module) -> Iterable[torch.nn.Module]:
    if isinstance(module, torch.nn.ModuleList):
        yield from module.children()
        return
    for child in module.children():
        yield from _stack_children(child)


def _outside(modules: list[torch.nn.Module], layers: list[torch.nn.Module]) -> list[torch.Tensor]:
    """The tensors of `modules` held by some module that is not under a layer (a tied one counts as outside)."""
    under = {id(m) for layer in layers for m in layer.modules()}
    owners = [m for module in modules for m in module.modules() if id(m) not in under]
    return list(_unique(t for m in owners for t in itertools.chain(m.parameters(recurse=False),
                                                                    m.buffers(recurse=False))))


def _tensors(modules: list[torch.nn.Module]) -> list[torch.Tensor]:
    return list(_unique(itertools.chain.from_iterable(
        itertools.chain(m.parameters(), m.buffers()) for m in modules)))


def _unique(tensors: Iterable[torch.Tensor]) -> Iterable[torch.Tensor]:
    return {id(t): t for t in tensors}.values()


def _widen(tensors: Iterable[torch.Tensor]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each floating tensor that is not float32 made float32, its file pages handed back; (tensor, own data)."""
    own = []
    for t in tensors:
        if t.is_floating_point() and t.dtype != torch.float32:
            data = t.data
            t.data = data.float()
            release(data)
            own.append((t, data))
    return own


def _narrow(own: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    for t, data in own:
        t.data = data
