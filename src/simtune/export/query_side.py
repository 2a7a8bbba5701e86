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
    modules) then `Normalize` when `normalize_output`; the `document` route is empty."""
    root.mkdir()
    types: dict[str, str] = {}
    route = _head(root, chain, normalize_output, write_dense, types, "query_")
    _config(root, types, {"query": route, "document": []})


def write_towers(root: Path, chain: list[Any] | None, encoder_normalize: bool,
                 normalize_output: bool, write_dense: Callable[[Path, Any], None]) -> None:
    """Write `root`'s `router_config.json` and the modules after `1_Pooling` (written by the
    caller, as are `encoder/` and `document_encoder/`): see the module docstring."""
    types = {"encoder": ST + "Transformer", "document_encoder": ST + "Transformer",
             "1_Pooling": ST + "Pooling"}
    shared = ["1_Pooling"]
    if encoder_normalize:
        (root / "2_Normalize").mkdir()
        types["2_Normalize"] = ST + "Normalize"
        shared.append("2_Normalize")
    head = _head(root, chain, normalize_output, write_dense, types, "")
    _config(root, types, {"query": ["encoder", *shared, *head],
                          "document": ["document_encoder", *shared]})


def _head(root: Path, chain: list[Any] | None, normalize_output: bool,
          write_dense: Callable[[Path, Any], None], types: dict[str, str], prefix: str
          ) -> list[str]:
    """Write the head's modules into `root` (`chain`'s `Dense` modules, then `Normalize` when
    `normalize_output`), each named `<prefix><index in types>_<kind>` and added to `types`;
    returns their names in order."""
    if chain is None:  # every head type has a plain form (`st_layout.RULES`)
        raise ValueError("a query-side head needs a plain Dense form")
    names = []
    for dense in chain:
        names.append(f"{prefix}{len(types)}_Dense")
        write_dense(root / names[-1], dense)
        types[names[-1]] = ST + "Dense"
    if normalize_output:
        names.append(f"{prefix}{len(types)}_Normalize")
        (root / names[-1]).mkdir()
        types[names[-1]] = ST + "Normalize"
    return names


def _config(root: Path, types: dict[str, str], structure: dict[str, list[str]]) -> None:
    """`root`'s `router_config.json`, as `Router.save` writes it (`query` the default route)."""
    write_json(root / ROUTER_CONFIG, {
        "types": types, "structure": structure,
        "parameters": {"default_route": "query", "allow_empty_key": True, "route_mappings": {}}})
