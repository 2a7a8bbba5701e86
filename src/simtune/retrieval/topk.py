"""Exact cosine top-k, streamed: memory O(tile), never queries x corpus. Ties in score are broken
by corpus index (lower first), so rankings are deterministic; `metrics` ranks with it."""

from __future__ import annotations

import itertools
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch
import torch.nn.functional as F


def topk(queries: torch.Tensor, corpus: torch.Tensor, k: int, chunk: int = 1024,
         exclude: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Cosine top-k of each query: (Q, D), (N, D) -> scores (Q, k), indices (Q, k), on the CPU
    whatever the inputs' device (the results are small; labels and ids live on the CPU).

    `exclude` (Q,) gives for each query a corpus index to leave out (leave-one-out), or -1.
    Exact (indices as brute force's up to float ties), ties by lower corpus index, k capped
    at the candidates. CPU: (corpus block x `chunk` queries) tiles, one per worker thread,
    merged into a running top-k: memory O(tile), not O(Q x N); rows of unit norm
    (|norm^2 - 1| <= 1e-6) are used as they are, others scaled by 1 / norm. Other devices:
    dense (rows, N) score blocks of at most `_DENSE_BLOCK_BYTES`.
    """
    k = max(0, min(k, corpus.shape[0] - (exclude is not None)))
    if queries.device.type != "cpu" or corpus.device.type != "cpu":
        scores, idx = _topk_dense(queries, corpus, k, exclude)
        return scores.cpu(), idx.cpu()
    return _topk_tiled(queries, corpus, k, chunk, exclude)



_CORPUS_BLOCK = 1024  # corpus rows per score tile (tile sizes measured in bench/eval_topk.py)



_FIRST_BLOCK = 256  # a narrow first tile: its k-th best seeds the threshold cheaply



_UNIT_TOL = 1e-6  # rows with |norm^2 - 1| <= this are taken as unit vectors



_SIGN = np.uint32(0x80000000)



def _topk_tiled(queries: torch.Tensor, corpus: torch.Tensor, k: int, chunk: int,
                exclude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """CPU top-k: query blocks spread over worker threads, each with single-threaded BLAS."""
    q, c = _as_f32(queries), _as_f32(corpus)
    out_s = torch.full((len(q), k), -torch.inf)
    out_i = torch.full((len(q), k), -1, dtype=torch.long)
    if len(q) == 0 or k == 0:
        return out_s, out_i
    q_inv, c_inv = _inv_norms(q), _inv_norms(c)
    ex = exclude.cpu().numpy().astype(np.int64) if exclude is not None else None
    try:  # concurrent calls into a multi-threaded OpenBLAS would oversubscribe the cores
        from threadpoolctl import threadpool_limits
    except ImportError:  # then a single worker, and BLAS keeps its threads
        threadpool_limits = None
    workers = min(torch.get_num_threads(), -(-len(q) // 16)) if threadpool_limits else 1
    rounds = -(-len(q) // (workers * chunk))
    qb = -(-len(q) // (workers * rounds))  # equal blocks, as many per worker
    vals, idx = out_s.numpy(), out_i.numpy()

    def run(s: int) -> None:
        e = s + qb
        qn = q[s:e] if q_inv is None else q[s:e] * q_inv[s:e, None]
        _query_block(np.ascontiguousarray(qn), c, c_inv, k,
                     None if ex is None else ex[s:e], vals[s:e], idx[s:e])

    if workers == 1:
        for s in range(0, len(q), qb):
            run(s)
        return out_s, out_i
    with threadpool_limits(1, user_api="blas"), ThreadPoolExecutor(workers) as pool:
        list(pool.map(run, range(0, len(q), qb)))  # dynamic: a slowed core takes fewer blocks
    return out_s, out_i



def _as_f32(x: torch.Tensor) -> np.ndarray:
    """(R, D) tensor as a float32 numpy array, sharing memory when it already is float32."""
    return x.detach().to(torch.float32).numpy()



def _inv_norms(x: np.ndarray, rows: int = 65536) -> np.ndarray | None:
    """1 / max(norm, 1e-12) per row (R,), or None when every row is a unit vector already."""
    sq = np.concatenate([np.einsum("ij,ij->i", x[s : s + rows], x[s : s + rows])
                         for s in range(0, len(x), rows)])
    if np.all(np.abs(sq - 1) <= _UNIT_TOL):
        return None
    return (1 / np.maximum(np.sqrt(sq), 1e-12)).astype(np.float32)



def _query_block(qn: np.ndarray, c: np.ndarray, c_inv: np.ndarray | None, k: int,
                 ex: np.ndarray | None, vals: np.ndarray, idx: np.ndarray) -> None:
    """Top-k of unit queries qn (m, D) over c (N, D) into vals/idx (m, k), tile by tile.

    Tiles are (corpus rows, queries): OpenBLAS runs block (w, D) @ queries^T (D, m) faster
    here than queries @ block^T (one thread, 1024 x 768: 103 vs 97 GFLOP/s). Candidates are
    merged once about one per query has gathered: a stale (lower) threshold keeps more.
    """
    m, n = len(qn), len(c)
    q_t = np.ascontiguousarray(qn.T)
    width = max(_CORPUS_BLOCK, 8 * k)
    first = n if n <= width else min(width, max(_FIRST_BLOCK, 2 * k))
    edges = [0, *range(first, n, width), n]
    tile, mask = np.empty(width * m, np.float32), np.zeros(width * m + 8, bool)
    cols, thr = np.arange(m), np.full(m, -np.inf, np.float32)
    pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    merged = False
    for j0, j1 in itertools.pairwise(edges):
        t = tile[: (j1 - j0) * m].reshape(j1 - j0, m)
        np.matmul(np.ascontiguousarray(c[j0:j1]), q_t, out=t)
        if c_inv is not None:
            t *= c_inv[j0:j1, None]
        if ex is not None:
            hit = (ex >= j0) & (ex < j1)
            t[ex[hit] - j0, cols[hit]] = -np.inf
        pending.append(_candidates(t, j0, thr, k, mask))
        if sum(len(p[0]) for p in pending) >= m or j1 == n:
            q_loc, c_idx, v = (np.concatenate(x) for x in zip(*pending, strict=True))
            _merge(vals, idx, q_loc, c_idx, v, fresh=not merged)
            pending, merged = [], True
            thr = np.ascontiguousarray(vals[:, k - 1])



def _candidates(t: np.ndarray, j0: int, thr: np.ndarray, k: int, mask: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Entries of tile t (w, m) above each query's threshold thr (m,) and among the tile's k
    best for it: (query, corpus index, score), each (C,), per query in index order. One equal
    to thr cannot enter (k earlier rows score as much); ties at the tile's k-th best stay."""
    w, m = t.shape
    size = -(-t.size // 8) * 8
    mask[t.size : size] = False
    np.greater(t, thr, out=mask[: t.size].reshape(w, m))
    words = _nonzero_words(mask[:size])
    if w > k and len(words) > size // 64 and np.count_nonzero(mask) > t.size // 8:
        kth = np.partition(t, w - k, axis=0)[w - k]  # many candidates (the first tile)
        # t > nextafter(kth, -inf) is t >= kth: every tie at the cut stays a candidate
        np.greater(t, np.where(kth > thr, np.nextafter(kth, -np.inf), thr),
                   out=mask[: t.size].reshape(w, m))
        words = _nonzero_words(mask[:size])
    w_i, b_i = np.nonzero(mask[:size].reshape(-1, 8)[words])
    flat = words[w_i] * 8 + b_i
    c_loc, q_loc = np.divmod(flat, m)
    return q_loc, c_loc + j0, t.ravel()[flat]



def _nonzero_words(mask: np.ndarray) -> np.ndarray:
    """Indices (W,) of the 8-flag words of a sparse bool mask (8n,) with a flag set: 3x faster
    here than np.flatnonzero on the flags (0.036 vs 0.11 ns per flag)."""
    return np.flatnonzero(mask.view(np.uint64) != 0)



def _merge(vals: np.ndarray, idx: np.ndarray, q_loc: np.ndarray, c_idx: np.ndarray,
           v: np.ndarray, fresh: bool) -> None:
    """Merge candidates (query, corpus index, score) (C,) into the running top-k (m, k).

    vals/idx rows stay ordered by (score desc, index asc); the candidates come per query in
    index order, all after the rows' entries. `fresh`: vals/idx hold no entry yet.
    """
    m, k = vals.shape
    counts = np.bincount(q_loc, minlength=m)
    rows = np.flatnonzero(counts)
    if len(rows) == 0:
        return
    group = np.zeros(m, np.int64)
    group[rows] = np.arange(len(rows))
    counts = counts[rows]
    # the old entries first, then the candidates in index order: a stable sort by
    # (row, score desc) then keeps equal scores in corpus-index order
    old = 0 if fresh and counts.min() >= k else k
    row_e = np.concatenate([np.repeat(np.arange(len(rows)), old), group[q_loc]])
    val_e = np.concatenate([vals[rows, :old].ravel(), v])
    idx_e = np.concatenate([idx[rows, :old].ravel(), c_idx])
    order = np.argsort(_desc_key(row_e, val_e), kind="stable")
    size = counts + old
    keep = order[np.arange(len(order)) - np.repeat(np.cumsum(size) - size, size) < k]
    vals[rows] = val_e[keep].reshape(len(rows), k)
    idx[rows] = idx_e[keep].reshape(len(rows), k)



def _desc_key(rows: np.ndarray, v: np.ndarray) -> np.ndarray:
    """uint64 keys ordering (E,) entries by row, then float32 score descending."""
    u = (v + np.float32(0)).view(np.uint32)  # + 0 turns -0.0 into 0.0: they tie
    ascending = np.where(u & _SIGN, ~u, u | _SIGN)  # the float order as unsigned integers
    return (rows.astype(np.uint64) << np.uint64(32)) | (~ascending).astype(np.uint64)



def _topk_dense(queries: torch.Tensor, corpus: torch.Tensor, k: int,
                exclude: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k from dense (rows, N) score blocks (accelerators): as many query rows per block as
    fit `_DENSE_BLOCK_BYTES` of scores (at least 16), so memory is O(budget), not O(Q x N),
    in few large kernels."""
    q_all, c = _unit_rows(queries.float()), _unit_rows(corpus.float())
    rows = max(16, _DENSE_BLOCK_BYTES // (4 * max(1, c.shape[0])))
    out_s, out_i = [torch.zeros(0, k, device=c.device)], [
        torch.zeros(0, k, dtype=torch.long, device=c.device)]
    for s in range(0, q_all.shape[0], rows):
        scores = q_all[s : s + rows] @ c.T
        if exclude is not None:
            ex = exclude[s : s + rows].to(c.device)
            hit = torch.nonzero(ex >= 0).squeeze(1)
            scores[hit, ex[hit]] = -torch.inf
        sc, ix = _topk_stable(scores, k) if k else (scores[:, :0], scores[:, :0].long())
        del scores  # before the next block is allocated
        out_s.append(sc)
        out_i.append(ix)
    return torch.cat(out_s), torch.cat(out_i)



def _unit_rows(x: torch.Tensor) -> torch.Tensor:
    """`x` itself when every row is a unit vector already (no copy of a large corpus), else
    the normalised copy."""
    norms = torch.linalg.vector_norm(x, dim=1)  # a reduction: no (N, D) temporary
    if len(x) == 0 or bool((norms * norms - 1).abs().max() <= _UNIT_TOL):
        return x
    return F.normalize(x, dim=-1)



def _topk_stable(scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Top-k per row with ties at every position ordered by column index."""
    extra = min(k + 1, scores.shape[1])
    vals, idx = torch.topk(scores, extra, dim=1)
    threshold = vals[:, k - 1 : k]
    # the (k+1)-th best equals the k-th: more columns tie at the cut than fit, so which of
    # them are kept must be decided by index (rare: only these rows take the slow path)
    ambiguous = (vals[:, k] == vals[:, k - 1]) if extra > k else torch.zeros(
        len(vals), dtype=torch.bool, device=vals.device)
    vals, idx = vals[:, :k].contiguous(), idx[:, :k].contiguous()
    if ambiguous.any():
        rows = torch.nonzero(ambiguous).squeeze(1)
        sub, thr = scores[rows], threshold[rows]
        equal = sub == thr
        need = k - (sub > thr).sum(1, keepdim=True)
        chosen = (sub > thr) | (equal & (equal.cumsum(1) <= need))  # the first tied columns
        idx[rows] = chosen.nonzero()[:, 1].view(len(rows), k)
        vals[rows] = sub.gather(1, idx[rows])
    by_index = idx.argsort(1)  # then a stable sort by score keeps equal scores in index order
    idx, vals = idx.gather(1, by_index), vals.gather(1, by_index)
    order = torch.sort(vals, dim=1, descending=True, stable=True).indices
    return vals.gather(1, order), idx.gather(1, order)


_DENSE_BLOCK_BYTES = 1 << 30  # scores per dense block (measured on an H100: bench/gpu.py)
