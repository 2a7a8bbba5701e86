"""The export of a query-side head (`train.head.side: query`): sentence-transformers' `Router`.

A query tower (top_layers mode: the encoder's top layers trained for queries) exports two
encoders, `encoder/` (the tower) and `document_encoder/` (the frozen encoder); the export folder
itself is then one `Router` (`modules.json`: one module, path ""): the `query` route runs
`encoder` -> `1_Pooling` (-> `2_Normalize`) -> the head's `Dense` modules (-> `Normalize`), the
`document` route `document_encoder` -> the same `1_Pooling` (-> `2_Normalize`), so
`encode_document` gives the frozen encoder's vectors and each encoder is stored once
(`write_towers`). Otherwise:

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


def write_towers(root: Path, chain: list[Any] | None, encoder_normalize: bool,
                 normalize_output: bool, write_dense: Callable[[Path, Any], None]) -> None:
    """Write `root`'s `router_config.json` and the modules after `1_Pooling` (written by the
    caller, as are `encoder/` and `document_encoder/`): see the module docstring."""
    if chain is None:  # every head type has a plain form (`st_layout.RULES`)
        raise ValueError("a query-side head needs a plain Dense form")
    types = {"encoder": ST + "Transformer", "document_encoder": ST + "Transformer",
             "1_Pooling": ST + "Pooling"}
    shared = ["1_Pooling"]
    if encoder_normalize:
        (root / "2_Normalize").mkdir()
        types["2_Normalize"] = ST + "Normalize"
        shared.append("2_Normalize")
    head: list[str] = []
    for dense in chain:
        name = f"{len(types)}_Dense"
        write_dense(root / name, dense)
        types[name] = ST + "Dense"
        head.append(name)
    if normalize_output:
        name = f"{len(types)}_Normalize"
        (root / name).mkdir()
        types[name] = ST + "Normalize"
        head.append(name)
    write_json(root / ROUTER_CONFIG, {
        "types": types,
        "structure": {"query": ["encoder", *shared, *head],
                      "document": ["document_encoder", *shared]},
        "parameters": {"default_route": "query", "allow_empty_key": True, "route_mappings": {}}})
