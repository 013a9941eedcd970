"""Buckets: where a piece of work can go, and what each event name means to attribution.

A *bucket* is a (module, phase) pair, or a labelled unattributed entry (work outside every module).
Module m has bucket 2m (forward) and 2m+1 (backward); labels follow from 2M on.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from layerscope.attribution.catalog import ModuleInfo, catalog_from_ranges
from layerscope.attribution.compiled import COMPILED_GRAPH_PREFIX, is_compiling_range
from layerscope.attribution.steps import STEP_PREFIX
from layerscope.events.module_ranges import parse_module_range
from layerscope.model.profile import Phase

BACKWARD_NODE_PREFIX = "autograd::engine::evaluate_function: "
LABEL_STEP_GAPS = "(Python between ops)"
LABEL_MEMORY_OUTSIDE_OPS = "(memory outside ops)"
LABEL_UNLINKED_DEVICE = "(device work without a launching op)"

# Per-name roles, precomputed once per distinct name.
ROLE_PLAIN, ROLE_MODULE, ROLE_BACKWARD_NODE, ROLE_STEP, ROLE_COMPILING, ROLE_COMPILED_GRAPH = 0, 1, 2, 3, 4, 5


@dataclass
class Buckets:
    """Bucket ids: module m has 2m (forward) and 2m+1 (backward); labels follow from 2M on.

    ``occurrences`` counts, per label, how often work started under it (a top-level op, a backward
    node, an allocation outside ops): the "calls" of an unattributed entry.
    """

    module_count: int
    labels: list[tuple[str, Phase]] = field(default_factory=list)
    ids: dict[tuple[str, Phase], int] = field(default_factory=dict)
    occurrences: list[int] = field(default_factory=list)

    def unattributed(self, label: str, phase: Phase, count: int = 1) -> int:
        """The bucket of an unattributed label (made on first use), counting ``count`` occurrences."""
        key = (label, phase)
        found = self.ids.get(key)
        if found is None:
            found = self.ids[key] = 2 * self.module_count + len(self.labels)
            self.labels.append(key)
            self.occurrences.append(0)
        self.occurrences[found - 2 * self.module_count] += count
        return found

    @property
    def count(self) -> int:
        """How many buckets exist so far."""
        return 2 * self.module_count + len(self.labels)

    def phase_of(self, bucket: int) -> Phase:
        """The phase a bucket's work belongs to."""
        if bucket < 2 * self.module_count:
            return Phase.BACKWARD if bucket & 1 else Phase.FORWARD
        return self.labels[bucket - 2 * self.module_count][1]

    def where(self, bucket: int, catalog: list[ModuleInfo]) -> str:
        """A module's path, or an unattributed entry's label."""
        two_m = 2 * self.module_count
        return catalog[bucket // 2].path if bucket < two_m else self.labels[bucket - two_m][0]


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
    """Classify every distinct name once: module range, backward node, profiler step, compilation,
    compiled graph call, or plain op. Without a catalog, modules come from the range names plus
    ``known_modules`` ((path, type) pairs a trace carries for modules without ranges of their own);
    a trace with neither uses its user annotations (``record_function`` ranges, ``annotation_names``)
    as top-level regions instead (``NameRoles.regions``)."""
    found_ranges: dict[int, tuple[str, str]] = {}
    for name_id, name in enumerate(names):
        parsed = parse_module_range(name)
        if parsed is not None:
            found_ranges[name_id] = parsed
    regions = False
    if catalog is None and not found_ranges and not known_modules and annotation_names:
        for name_id in sorted(annotation_names):
            name = names[name_id]
            if name and not name.startswith(STEP_PREFIX) and not is_compiling_range(name):
                # a dot would make a hierarchy out of a name: regions are flat, under the root
                found_ranges[name_id] = (name.replace(".", "_"), REGION_TYPE)
        regions = bool(found_ranges)
    if catalog is None:
        catalog = catalog_from_ranges([*found_ranges.values(), *(known_modules or [])])
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
        elif name.startswith(BACKWARD_NODE_PREFIX):
            roles[name_id] = ROLE_BACKWARD_NODE
        elif name.startswith(STEP_PREFIX):
            roles[name_id] = ROLE_STEP
        elif is_compiling_range(name):
            roles[name_id] = ROLE_COMPILING
        elif name.startswith(COMPILED_GRAPH_PREFIX):
            roles[name_id] = ROLE_COMPILED_GRAPH
    return NameRoles(catalog, found_ranges, roles, role_module, regions)


def _extend_catalog(catalog: list[ModuleInfo], extra: list[tuple[str, str]]) -> list[ModuleInfo]:
    known = {info.path for info in catalog}
    added = [info for info in catalog_from_ranges(extra) if info.path not in known]
    return list(catalog) + added
