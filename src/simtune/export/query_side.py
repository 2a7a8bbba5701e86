"""The export of a query-side head (`train.head.side: query`): sentence-transformers' `Router`.

`modules.json` chains `Transformer` -> `Pooling` (-> `Normalize`) -> `Router`; the router's
`query` route holds the head (its `Dense` modules, as `st_layout` writes them) and the output
`Normalize`; its `document` route is empty, so `encode_document` gives the frozen encoder's
vectors bit for bit (an index of them stays valid). `default_route` is `query`: a plain
`encode` embeds as a query, as `simtune.model.Model.encode` does. The router's files are those
`Router.save` writes (sentence-transformers >= 5: `router_config.json` with `types`,
`structure`, `parameters`; each module in a folder named by its id, inside the router's)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from simtune.atomic import write_json

ST = "sentence_transformers.models."
ROUTER_CONFIG = "router_config.json"


def write_router(root: Path, chain: list[Any] | None, normalize_output: bool,
                 write_dense: Callable[[Path, Any], None]) -> None:
    """Write the router folder `root` (created): the `query` route is `chain` (`st_layout.Dense`
    modules) then `Normalize` when
    `normalize_output`; the `document` route is empty."""
    if chain is None:  # every head type has a plain form (`st_layout.RULES`)
        raise ValueError("a query-side head needs a plain Dense form")
    root.mkdir()
    types: dict[str, str] = {}
    for dense in chain:
        name = f"query_{len(types)}_Dense"
        write_dense(root / name, dense)
        types[name] = ST + "Dense"
    route = list(types)
    if normalize_output:
        name = f"query_{len(route)}_Normalize"
        (root / name).mkdir()
        types[name] = ST + "Normalize"
        route.append(name)
    write_json(root / ROUTER_CONFIG, {
        "types": types, "structure": {"query": route, "document": []},
        "parameters": {"default_route": "query", "allow_empty_key": True, "route_mappings": {}}})
