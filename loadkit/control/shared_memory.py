"""System shared memory for a process's requests (`shared_memory: system`): per template, one
region holding every pool entry's inputs (written once, at start) and one for its outputs,
registered with the server; the requests name regions instead of carrying tensors.

Outputs: one slot per output shared by the template's requests, or, when the template
validates, one per pool entry (two requests for the same entry write the same answer, so a
read is never torn by another request's). Everything this process made is unregistered and
unlinked by `close` (the drive's stop); regions a killed process left are found by name
(transport/shm.py) and removed by `sweep` (the run's end and start)."""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from loadkit.errors import ControlError, TargetError
from loadkit.scenario import DTYPES, RequestTemplate
from loadkit.transport.door import Outputs, Refs, Tensors
from loadkit.transport.payloads import tensor_bytes
from loadkit.transport.shm import Region, aligned, stale, stale_files, unlink

log = logging.getLogger("loadkit.shm")
DEFAULT_OUTPUT_BYTES = 100 * 1024  # perf_analyzer's --output-shared-memory-size default
SIZES = {"BYTES": 0, "BOOL": 1, "INT8": 1, "UINT8": 1, "INT16": 2, "UINT16": 2, "FP16": 2,
         "BF16": 2, "INT32": 4, "UINT32": 4, "FP32": 4, "INT64": 8, "UINT64": 8, "FP64": 8}
LOCAL_HOSTS = ("127.0.0.1", "localhost", "::1", "[::1]")


def output_bytes(datatype: str, shape: Sequence[int], batch: int, default: int) -> int:
    """One request's bytes of an output: exact for a fixed shape, else `default`."""
    size = SIZES.get(datatype, 0)
    if not size or any(int(d) < 0 for d in shape):
        return default
    return int(np.prod([int(d) for d in shape], dtype=np.int64)) * size * max(1, batch)


def check_local(address: str) -> None:
    """Shared memory is this host's: the server must be on it."""
    host = address.split("://")[-1].rpartition(":")[0]
    if host not in LOCAL_HOSTS:
        raise TargetError(f"shared_memory: system needs Triton on this host (its regions are "
                          f"this machine's /dev/shm); {address} is not loopback: leave "
                          "shared_memory out, or run loadkit on the server's host")


class SystemMemory:
    """A process's regions, registered through `control` (its door's control client)."""

    def __init__(self, control: Any, output_size: int = DEFAULT_OUTPUT_BYTES):
        self.control = control
        self.output_size = output_size
        self.regions: list[Region] = []
        # per template name: output name -> (datatype, region, first offset, slot bytes)
        self.outputs: dict[str, dict[str, tuple[str, Region, int, int]]] = {}

    def _region(self, size: int) -> Region:
        region = Region(size)
        self.regions.append(region)
        try:
            self.control.register_system_shm(region.name, region.key, region.size)
        except ControlError as exc:
            raise TargetError(f"Triton refused to register shared memory region "
                              f"{region.name} ({region.size} bytes): {exc}") from None
        return region

    def place(self, template: RequestTemplate, pool: list[Tensors]) -> list[tuple[Refs, Refs]]:
        """Write the pool's inputs into a region of their own; give each entry the regions
        its inputs are in and its outputs go to."""
        blobs = [[tensor_bytes(arr, spec.dtype) for spec, arr in entry] for entry in pool]
        inputs = self._region(aligned([len(b) for entry in blobs for b in entry]))
        refs_in: list[Refs] = []
        for entry, raw in zip(pool, blobs, strict=True):
            refs_in.append({spec.name: (inputs.name, inputs.put(b), len(b))
                            for (spec, _arr), b in zip(entry, raw, strict=True)})
        outs = self._outputs(template, len(pool))
        refs_out = [{name: (region.name, first + (k * size if template.validate else 0), size)
                     for name, (_dt, region, first, size) in outs.items()}
                    for k in range(len(pool))]
        return list(zip(refs_in, refs_out, strict=True))

    def _outputs(self, template: RequestTemplate, entries: int) -> dict[str, tuple[
            str, Region, int, int]]:
        meta = self.control.metadata_of(template.model)
        batch = template.batch_size if template.batched else 1
        named = {o["name"]: o for o in meta.get("outputs", [])}
        wanted = list(template.outputs) or list(named)
        sizes = {n: output_bytes(named[n]["datatype"], named[n].get("shape", [])[
            1 if template.batched and named[n].get("shape") else 0:], batch, self.output_size)
            for n in wanted if n in named}
        slots = entries if template.validate else 1
        region = self._region(aligned([s for s in sizes.values()] * slots))
        out: dict[str, tuple[str, Region, int, int]] = {}
        for name, size in sizes.items():
            first = region.put(b"\0" * size)
            for _ in range(slots - 1):
                region.put(b"\0" * size)
            out[name] = (named[name]["datatype"], region, first, size)
        self.outputs[template.name] = out
        return out

    def read(self, template: str, entry: int, expected: dict[str, np.ndarray]) -> Outputs:
        """Entry `entry`'s outputs as the server wrote them (for validation), each read to the
        size the expected values have."""
        out: Outputs = {}
        for name, (datatype, region, first, size) in self.outputs.get(template, {}).items():
            want = expected.get(name)
            n = size
            if want is not None and datatype in DTYPES and SIZES.get(datatype):
                n = min(size, int(np.asarray(want).size) * SIZES[datatype])
            out[name] = (datatype, region.read(first + entry * size, n))
        return out

    def close(self) -> None:
        """Unregister and unlink every region this process made (idempotent)."""
        for region in self.regions:
            try:
                self.control.unregister_system_shm(region.name)
            except ControlError as exc:
                log.warning("unregister %s: %s", region.name, exc)
            region.close()
        self.regions.clear()


def sweep(control: Any, *, mine: bool = False) -> list[str]:
    """Unregister and unlink loadkit's regions whose process is gone (with `mine`: this
    process's too, once its drive is done); the names removed."""
    pid = f"loadkit-{os.getpid()}-"
    try:
        registered = control.system_shm_regions()
    except ControlError:
        registered = []
    gone = stale(registered) + ([n for n in registered if n.startswith(pid)] if mine else [])
    for name in gone:
        try:
            control.unregister_system_shm(name)
        except ControlError as exc:
            log.warning("unregister %s: %s", name, exc)
    files = stale_files()
    if mine:
        from loadkit.transport.shm import SHM_DIR

        files += [p.name for p in SHM_DIR.glob(f"{pid}*")]
    unlink(files)
    return sorted(set(gone) | set(files))


def refuse(scenario: Any, address: str, infos: dict[str, Any]) -> None:
    """What shared memory cannot do here, refused before anything is sent: a target on
    another host, CUDA regions, an output larger than the region slot it was given."""
    target = scenario.target
    if target.shared_memory == "none":
        return
    if target.shared_memory == "cuda":
        import shutil

        gpu = "a GPU was found" if shutil.which("nvidia-smi") else "no GPU was found here"
        raise TargetError(f"shared_memory: cuda: {gpu}, and loadkit does not create CUDA "
                          "regions yet (docs/doors.md); use shared_memory: system (the "
                          "tensors still skip the network copy), or leave it out")
    check_local(address)
    for t in scenario.requests.values():
        info = infos.get(t.model)
        outputs = getattr(info, "outputs", {}) or {}
        for name, (datatype, shape) in outputs.items():
            if t.outputs and name not in t.outputs:
                continue
            dims = shape[1:] if t.batched and shape else shape
            need = output_bytes(datatype, dims, t.batch_size if t.batched else 1, 0)
            if need > (target.output_shm_bytes or DEFAULT_OUTPUT_BYTES):
                raise TargetError(
                    f"request template '{t.name}': output '{name}' of {t.model} is {need} "
                    f"bytes per request, above the "
                    f"{target.output_shm_bytes or DEFAULT_OUTPUT_BYTES} bytes given to "
                    f"each output region (target.output_shared_memory_size or "
                    f"--output-shared-memory-size): give at least {need}")
