"""The models a replica holds: loaded on demand (Serve model multiplexing), at most
``max_resident_models`` at a time, the least recently used unloaded first once no request
holds it (:mod:`acare_ray.online.deployment`'s replica uses it)."""

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from ray import serve

from acare_ray.online.models import (
    ModelCatalog,
    Served,
    model_card,
)


class ModelSlot:
    """One loaded model on this replica and how many requests hold it.

    Serve's multiplexer unloads the least recently used model when it loads one more than
    ``max_resident_models`` and awaits the evicted object's ``__del__``. Here that is
    :meth:`unload`, set as an instance attribute (so garbage collection never calls it): it
    waits until no request holds the model, then lets it go. The load that evicted it waits
    meanwhile, so at most ``max_resident_models`` models are in memory, and a request never
    loses its model halfway.
    """

    def __init__(self, served: Served, on_unload: Any = None) -> None:
        self.served: Served | None = served
        self.name = served.name
        self.holders = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._on_unload = on_unload
        self.__del__ = self.unload

    def hold(self) -> None:
        self.holders += 1
        self._idle.clear()

    def drop(self) -> None:
        self.holders -= 1
        if self.holders == 0:
            self._idle.set()

    async def unload(self) -> None:
        await self._idle.wait()
        self.served = None
        if self._on_unload is not None:
            self._on_unload(self)


class ReplicaModels:
    """The :class:`~acare_ray.online.models.ModelRouter` of a replica: loads models on demand
    through ``@serve.multiplexed`` (at most ``max_resident`` at once) with ``build(name)`` on
    a loader thread; ``preloaded`` (the default model, loaded when the replica started) is
    handed to the multiplexer by the first load, or unloaded if that load is another model."""

    def __init__(
        self,
        catalog: ModelCatalog,
        build: Any,
        max_resident: int,
        preloaded: Served,
        scorer_for: Any,
    ) -> None:
        self.catalog = catalog
        self.max_resident = max_resident
        self._build = build
        self._scorer_for = scorer_for
        self.resident: dict[str, ModelSlot] = {}
        self.cards_seen: dict[str, tuple[dict[str, Any], str | None]] = {}
        self.loads = 0
        self._preloaded: ModelSlot | None = self._slot(preloaded)

        async def load_acare_model(name: str) -> ModelSlot:
            return await self._load(name)

        self._multiplexed = serve.multiplexed(max_num_models_per_replica=max_resident)(
            load_acare_model
        )

    def _slot(self, served: Served) -> ModelSlot:
        slot = ModelSlot(served, self._unloaded)
        served.score = self._scorer_for(slot)
        self.resident[served.name] = slot
        self.cards_seen[served.name] = (served.service.describe(), served.version)
        return slot

    def _unloaded(self, slot: ModelSlot) -> None:
        if self.resident.get(slot.name) is slot:
            del self.resident[slot.name]
        gc.collect()  # the model's tensors, before the next one is loaded
        _empty_device_cache()

    async def _load(self, name: str) -> ModelSlot:
        preloaded, self._preloaded = self._preloaded, None
        if preloaded is not None:
            if preloaded.name == name:
                return preloaded
            await preloaded.unload()  # resident outside the multiplexer's count: let it go
        served = await asyncio.to_thread(self._build, name)
        self.loads += 1
        return self._slot(served)

    @asynccontextmanager
    async def use(self, name: str) -> AsyncIterator[Served]:
        slot = await self._multiplexed(name)
        slot.hold()  # no await since the load returned: it cannot have been unloaded
        try:
            assert slot.served is not None
            yield slot.served
        finally:
            slot.drop()

    def any_resident(self) -> ModelSlot | None:
        return next(reversed(self.resident.values()), None)

    def cards(self) -> list[dict[str, Any]]:
        if not self.catalog.strict:  # one model: the card it always had
            described, _ = self.cards_seen[self.catalog.default]
            return [described]
        out = []
        for name in self.catalog.names:
            described, version = self.cards_seen.get(name, (None, None))
            card = model_card(
                name, self.catalog.sources[name], described, version, name == self.catalog.default
            )
            out.append(card | {"loaded": name in self.resident})
        return out

    def snapshot(self) -> dict[str, Any]:
        return {
            "default": self.catalog.default,
            "resident": list(self.resident),
            "max_resident": self.max_resident,
            "loads": self.loads,
        }


def _empty_device_cache() -> None:
    import torch

    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.empty_cache()
