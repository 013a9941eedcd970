"""Buckets: where a piece of work can go, and what each event name means to attribution.

A *bucket* is a (module, phase) pair, or a labelled unattributed entry (work outside every module).
Module m has bucket 2m (forward) and 2m+1 (backward); labels follow from 2M on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerscope.attribution.catalog import ModuleInfo, catalog_from_ranges
from layerscope.events.names import (
    backward_node_name,
    is_compiled_graph_call,
    is_compiling_range,
    is_step_range,
    parse_module_range,
)
from layerscope.model.profile import Phase

LABEL_STEP_GAPS = "(Python between ops)"
LABEL_MEMORY_OUTSIDE_OPS = "(memory outside ops)"
LABEL_UNLINKED_DEVICE = "(device work without a launching op)"

# Per-name roles, precomputed once per distinct name.
ROLE_PLAIN, ROLE_MODULE, ROLE_BACKWARD_NODE, ROLE_STEP, ROLE_COMPILING, ROLE_COMPILED_GRAPH = 0, 1, 2, 3, 4, 5


@dataclass
class Buckets:
    """Bucket ids: module m has 2m (forward) and 2m+1 (backward); labels follow from 2M on.

    This class is the one place that knows the numbering: everything else asks it (``forward(m)``,
    ``module_of(b)``, ``label_bucket(k)``...), or takes a table or slice from it where a method call
    per event would weigh on a hot loop.

    ``occurrences`` counts, per label, how often work started under it (a top-level op, a backward
    node, an allocation outside ops): the "calls" of an unattributed entry.
    """

    module_count: int
    labels: list[tuple[str, Phase]] = field(default_factory=list)
    ids: dict[tuple[str, Phase], int] = field(default_factory=dict)
    occurrences: list[int] = field(default_factory=list)
    #: How many buckets modules have (two each); the first label's bucket.
    module_bucket_count: int = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self.module_bucket_count = 2 * self.module_count

    # ---- module buckets ----------------------------------------------------------------------------

    @staticmethod
    def forward(module: int) -> int:
        """The forward bucket of module ``module`` (its catalog index)."""
        return 2 * module

    @staticmethod
    def backward(module: int) -> int:
        """The backward bucket of module ``module``."""
        return 2 * module + 1

    @staticmethod
    def with_phase(module: int, phase_bit: int) -> int:
        """Module ``module``'s bucket in the phase whose :meth:`phase_bit` is ``phase_bit``."""
        return 2 * module + phase_bit

    @staticmethod
    def phase_bit(bucket: int) -> int:
        """0 for a forward module bucket, 1 for a backward one (module buckets only)."""
        return bucket & 1

    @staticmethod
    def module_of(bucket: int) -> int:
        """The catalog index of a module bucket's module (module buckets only)."""
        return bucket // 2

    def is_module(self, bucket: int) -> bool:
        """Whether ``bucket`` is a module's (either phase), not a label's nor -1 (no bucket)."""
        return 0 <= bucket < self.module_bucket_count

    def is_forward(self, bucket: int) -> bool:
        """Whether ``bucket`` is a module's forward bucket."""
        return self.is_module(bucket) and not bucket & 1

    def is_backward(self, bucket: int) -> bool:
        """Whether ``bucket`` is a module's backward bucket."""
        return self.is_module(bucket) and bool(bucket & 1)

    def forward_buckets(self) -> list[int]:
        """Per module (catalog index), its forward bucket: a table for hot loops."""
        return [self.forward(m) for m in range(self.module_count)]

    def backward_of_module(self) -> dict[int, int]:
        """Per module bucket, forward or backward, the same module's backward bucket: where a backward
        node goes whose forward op ran in it (a recomputation's ops run in the backward bucket)."""
        return {b: self.backward(m) for m in range(self.module_count) for b in (2 * m, 2 * m + 1)}

    @property
    def forward_slice(self) -> slice:
        """The forward buckets of all modules in catalog order, as a slice of a per-bucket array."""
        return slice(0, self.module_bucket_count, 2)

    @property
    def backward_slice(self) -> slice:
        """The backward buckets of all modules in catalog order, as a slice of a per-bucket array."""
        return slice(1, self.module_bucket_count, 2)

    # ---- label buckets -----------------------------------------------------------------------------

    def unattributed(self, label: str, phase: Phase, count: int = 1) -> int:
        """The bucket of an unattributed label (made on first use), counting ``count`` occurrences."""
        key = (label, phase)
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = self.module_bucket_count + len(self.labels)
            self.labels.append(key)
            self.occurrences.append(0)
        self.occurrences[found - self.module_bucket_count] += count
        return found

    def label_bucket(self, k: int) -> int:
        """The bucket of the ``k``-th label (in order of first use)."""
        return self.module_bucket_count + k

    def label_index(self, bucket: int) -> int:
        """Which label a label bucket is (its index in ``labels``)."""
        return bucket - self.module_bucket_count

    # ---- any bucket --------------------------------------------------------------------------------

    @property
    def count(self) -> int:
        """How many buckets exist so far."""
        return self.module_bucket_count + len(self.labels)

    def phase_of(self, bucket: int) -> Phase:
        """The phase a bucket's work belongs to."""
        if self.is_module(bucket):
            return Phase.BACKWARD if self.phase_bit(bucket) else Phase.FORWARD
        return self.labels[self.label_index(bucket)][1]

    def where(self, bucket: int, catalog: list[ModuleInfo]) -> str:
        """A module's path, or an unattributed entry's label."""
        if self.is_module(bucket):
            return catalog[self.module_of(bucket)].path
        return self.labels[self.label_index(bucket)][0]


@dataclass(frozen=True)
class NameRoles:
    """The catalog (discovered from range names when none was given) and what each name means."""

    catalog: list[ModuleInfo]
    module_ranges: dict[int, tuple[str, str]]  # name id -> (path, type) of layerscope module ranges
    roles: list[int]  # per name id: ROLE_*
    role_module: list[int]  # per name id: the catalog index of a module range, else -1
    regions: bool = False  # modules are user annotations standing in for a trace without modules


#: The type shown for user ``record_function`` ranges used as top-level regions (traces without modules).
REGION_TYPE = "record_function"


def name_roles(
    names: list[str],
    catalog: list[ModuleInfo] | None,
    known_modules: list[tuple[str, str]] | None = None,
    annotation_names: set[int] | None = None,
) -> NameRoles:
    """Classify every distinct name once: module range, backward node, step (``events/steps.py``),
    compilation, compiled graph call, or plain op. Without a catalog, modules come from the range names plus
    ``known_modules`` ((path, type) pairs a trace carries for modules without ranges of their own);
    a trace with neither uses its user annotations (``record_function`` ranges, ``annotation_names``)
    as top-level regions instead (``NameRoles.regions``)."""
    # both kinds of step range, whichever gives the step windows (``events/steps.py``)
    steps = {name_id for name_id, name in enumerate(names) if is_step_range(name) is not None}
    found_ranges: dict[int, tuple[str, str]] = {}
    for name_id, name in enumerate(names):
        parsed = parse_module_range(name)
        if parsed is not None:
            found_ranges[name_id] = parsed
    regions = False
    if catalog is None and not found_ranges and not known_modules and annotation_names:
        for name_id in sorted(annotation_names):
            name = names[name_id]
            if name and name_id not in steps and not is_compiling_range(name):
                # a dot would make a hierarchy out of a name: regions are flat, under the root
                found_ranges[name_id] = (name.replace(".", "_"), REGION_TYPE)
        regions = bool(found_ranges)
    if catalog is None:
        saved_order = [path for path, _ in known_modules or []]
        catalog = catalog_from_ranges([*found_ranges.values(), *(known_modules or [])], saved_order)
    module_index = {info.path: i for i, info in enumerate(catalog)}
    extra = [pair for pair in found_ranges.values() if pair[0] not in module_index]
    if extra:  # ranges of modules the catalog does not know (e.g. a foreign root): add them
        catalog = _extend_catalog(catalog, extra)
        module_index = {info.path: i for i, info in enumerate(catalog)}
    roles = [ROLE_PLAIN] * len(names)
    role_module = [-1] * len(names)
    for name_id, name in enumerate(names):
        if name_id in found_ranges:
            roles[name_id] = ROLE_MODULE
            role_module[name_id] = module_index[found_ranges[name_id][0]]
        elif backward_node_name(name) is not None:
            roles[name_id] = ROLE_BACKWARD_NODE
        elif name_id in steps:
            roles[name_id] = ROLE_STEP
        elif is_compiling_range(name):
            roles[name_id] = ROLE_COMPILING
        elif is_compiled_graph_call(name):
            roles[name_id] = ROLE_COMPILED_GRAPH
    return NameRoles(catalog, found_ranges, roles, role_module, regions)


def _extend_catalog(catalog: list[ModuleInfo], extra: list[tuple[str, str]]) -> list[ModuleInfo]:
    known = {info.path for info in catalog}
    added = [info for info in catalog_from_ranges(extra) if info.path not in known]
    return list(catalog) + added
