"""Merge image and video embeddings into a step's text embeddings, encoding only what the step
needs. A video whose adapter declares its frame groups separable is handled as its frame groups
(``items.frame_groups``): each is an item of its own, cached under (video hash, group index) and
encoded only when a chunk overlaps its rows."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from sglang.srt.core.perf_counters import wait_for_device
from sglang.srt.mem_cache.embedding_store import EmbeddingStore
from sglang.srt.mem_cache.mm_embedding_cache import CachedEmbedding, MultimodalEmbeddingCache
from sglang.srt.models.adapters.base import context_key
from sglang.srt.multimodal.frame_groups import frame_groups
from sglang.srt.multimodal.image_io import content_hash
from sglang.srt.multimodal.remote_encoder import RemoteEncoders

if TYPE_CHECKING:
    from sglang.srt.core.mm_item import MultimodalItem
    from sglang.srt.core.req import Req
    from sglang.srt.models.adapters import ModelAdapter
    from sglang.srt.multimodal.processor import ImagePreprocessor

logger = logging.getLogger(__name__)

Entries = dict[int, CachedEmbedding]


@dataclass
class EncoderStats:
    encoder_calls: int = 0
    encoded_items: int = 0
    encoded_tokens: int = 0
    encoder_seconds: float = 0.0
    preprocess_skipped: int = 0
    max_call_tokens: int = 0

    def as_dict(self) -> dict[str, int | float]:
        """The counters under their ``/server_info`` names."""
        return {
            "encoded_items": self.encoded_items,
            "encoded_tokens": self.encoded_tokens,
            "encoder_calls": self.encoder_calls,
            "encoder_seconds": self.encoder_seconds,
            "max_encoder_call_tokens": self.max_call_tokens,
            "preprocess_skipped": self.preprocess_skipped,
        }


def _move_items_to_device(
    items: list[MultimodalItem], device: torch.device | str, dtype: torch.dtype | None = None
) -> list[dict]:
    """The one place where pixel features leave the host (and take the model's dtype).

    numpy arrays become tensors without a copy, host tensors are pinned when the target is CUDA,
    and moves are non-blocking; floating features are cast to ``dtype``. Returns the
    device-side feature dicts; items keep host features.
    """
    device = torch.device(device)
    moved = []
    for item in items:
        assert item.features is not None, "items are preprocessed before they move"
        out: dict[str, Any] = {}
        for name, value in item.features.items():
            tensor = torch.from_numpy(value) if isinstance(value, np.ndarray) else value
            if isinstance(tensor, torch.Tensor):
                if device.type == "cuda" and tensor.device.type == "cpu":
                    tensor = tensor.pin_memory()
                cast = dtype if dtype is not None and tensor.is_floating_point() else None
                tensor = tensor.to(device, dtype=cast, non_blocking=True)
            out[name] = tensor
        moved.append(out)
    return moved


class MultimodalEmbedder:
    def __init__(
        self,
        adapter: ModelAdapter,
        preprocess: ImagePreprocessor,
        cache: MultimodalEmbeddingCache,
        device: str,
        dtype: torch.dtype,
        encoder_token_budget: int,
        mode: str = "per-image",
        video_groups: bool = True,
        store: EmbeddingStore | None = None,
        remote: RemoteEncoders | None = None,
    ) -> None:
        self.adapter = adapter
        self.preprocess = preprocess
        self.cache = cache
        self.device = device
        self.dtype = dtype
        self.encoder_token_budget = encoder_token_budget
        self.mode = mode
        self.video_groups = video_groups  # False: a video is one item (one cache entry)
        self.store = store  # the fleet's shared entries, behind the local cache (per-image mode)
        self.remote = remote  # encoder-only workers, tried before the local tower
        self.stats = EncoderStats()

    def embed(
        self, reqs: list[Req], prefix_lens: list[int], extend_lens: list[int], embeds: torch.Tensor
    ) -> dict[str, Any]:
        """Write image embeddings into ``embeds`` (T, hidden) in place; return extra LM kwargs."""
        self._override_token_embeddings(reqs, prefix_lens, extend_lens, embeds)
        chunks = self._get_chunked_embedding_by_item(reqs, prefix_lens, extend_lens)
        if not chunks:
            return {}
        positions = torch.cat([torch.as_tensor(p) for p, _ in chunks]).to(embeds.device)
        rows = [entry_rows for _, entry_rows in chunks]
        embeds[positions] = torch.cat([e.embedding for e in rows]).to(embeds.dtype)
        if not rows[0].extras:
            return {}
        order = torch.argsort(positions)
        extras = [
            torch.cat([e.extras[layer] for e in rows])[order].to(embeds.dtype)
            for layer in range(len(rows[0].extras))
        ]
        mask = torch.zeros(1, embeds.shape[0], dtype=torch.bool, device=embeds.device)
        mask[0, positions] = True
        return self.adapter.lm_kwargs(mask, extras)

    def _override_token_embeddings(
        self, reqs: list[Req], prefix_lens: list[int], extend_lens: list[int], embeds: torch.Tensor
    ) -> None:
        """Model-given embeddings for special tokens of prompts with images (Ovis2)."""
        overrides = self.adapter.token_embedding_overrides()
        if not overrides:
            return
        offset = 0
        for req, lo, n in zip(reqs, prefix_lens, extend_lens):
            if req.mm_items:
                ids = np.asarray(req.token_ids(lo, lo + n))
                for token_id, row in overrides.items():
                    hits = np.nonzero(ids == token_id)[0]
                    if len(hits):
                        embeds[torch.as_tensor(hits + offset)] = row.to(embeds.dtype)
            offset += n

    def _get_chunked_embedding_by_item(
        self, reqs: list[Req], prefix_lens: list[int], extend_lens: list[int]
    ) -> list[tuple[np.ndarray, CachedEmbedding]]:
        """For each request, the items overlapping [prefix_len, prefix_len + extend_len): resolve
        their embeddings (cache lookups; the misses of the whole batch deduplicated and encoded
        together) and return (packed token positions, the embedding rows inside the chunk)."""
        needed: list[tuple[int, Req, MultimodalItem, int, int]] = []
        offset = 0
        for i, req in enumerate(reqs):
            lo, hi = prefix_lens[i], prefix_lens[i] + extend_lens[i]
            for whole in req.mm_items:
                for item in self._units(whole):
                    if item.overlaps(lo, hi):
                        needed.append((offset - lo, req, item, lo, hi))
            offset += extend_lens[i]
        if not needed:
            return []
        if self.mode == "combined":
            found = self._resolve_combined(needed)
        else:
            found = self._resolve_per_image(needed)
        out = []
        for shift, _, item, lo, hi in needed:
            positions, rows = item.token_offsets(lo, hi)
            out.append((positions + shift, _take_rows(found[item.hash], rows)))
        return out

    def _units(self, item: MultimodalItem) -> list[MultimodalItem]:
        """The items the embedder caches and encodes for ``item``: a separable video's frame
        groups (made once per item), else the item itself."""
        if item.modality != "video" or not self._split_videos:
            return [item]
        if item.groups is None:
            item.groups = frame_groups(item, self.preprocess.video_settings.frames_per_group)
        return item.groups

    @property
    def _split_videos(self) -> bool:
        return self.video_groups and self.adapter.separable_video_groups and self.mode != "combined"

    def _resolve_per_image(
        self, needed: list[tuple[int, Req, MultimodalItem, int, int]]
    ) -> dict[int, CachedEmbedding]:
        """One cache entry per image; with mode "off" nothing is cached or looked up."""
        unique: dict[int, MultimodalItem] = {}
        for _, _, item, _, _ in needed:
            unique.setdefault(item.hash, item)
        found, shared, encoded = self.resolve(list(unique.values()))
        if self.mode != "off":
            for _, req, item, _, hi in needed:
                self._pin_until(req, item.hash, item.end, hi)
        for _, req, item, _, _ in needed:
            source = (
                "encoded"
                if item.hash in encoded
                else "global_cache"
                if item.hash in shared
                else "embedding_cache"
            )
            req.mm_sources.setdefault(item.hash, source)
        return {**found, **shared, **encoded}

    def resolve(self, items: list[MultimodalItem]) -> tuple[Entries, Entries, Entries]:
        """The embeddings of ``items`` (distinct keys) as (found in the local cache, loaded from
        the shared store, encoded). What was loaded or encoded enters the local cache (unless
        the mode is "off"); what was encoded enters the store."""
        found: Entries = {}
        misses: dict[int, MultimodalItem] = {}
        for item in items:
            entry = self.cache.get(item.hash, item.num_tokens) if self.mode != "off" else None
            if entry is None:
                misses[item.hash] = item
            else:
                found[item.hash] = entry
        shared = self._load_shared(misses)
        encoded = self._encode(list(misses.values()))
        if self.store is not None:
            self.store.save(encoded)
        if self.mode != "off":
            for key, entry in {**shared, **encoded}.items():
                self.cache.put(key, entry)
        return found, shared, encoded

    def _load_shared(self, misses: dict[int, MultimodalItem]) -> dict[int, CachedEmbedding]:
        """Take the local misses the shared store holds out of ``misses``; return them."""
        if self.store is None or not misses:
            return {}
        wanted = {key: item.num_tokens for key, item in misses.items()}
        shared = self.store.load(wanted, self.dtype)
        for key in shared:
            del misses[key]
        return {key: _on_device(entry, self.device) for key, entry in shared.items()}

    def _resolve_combined(
        self, needed: list[tuple[int, Req, MultimodalItem, int, int]]
    ) -> dict[int, CachedEmbedding]:
        """The legacy scheme: one entry per request keyed by all its images; a miss encodes
        every image of the request."""
        found: dict[int, CachedEmbedding] = {}
        missing: dict[int, tuple[Req, int]] = {}
        for _, req, _, _, hi in needed:
            key = _combined_key(req.mm_items)
            if key in missing or all(item.hash in found for item in req.mm_items):
                continue
            entry = self.cache.get(key, sum(item.num_tokens for item in req.mm_items))
            if entry is None:
                missing[key] = (req, hi)
            else:
                found.update(_split_combined(entry, req.mm_items))
                self._pin_until(req, key, req.mm_items[-1].end, hi)
        items = {item.hash: item for req, _ in missing.values() for item in req.mm_items}
        encoded = self._encode(list(items.values()))
        for key, (req, hi) in missing.items():
            parts = [encoded[item.hash] for item in req.mm_items]
            combined = CachedEmbedding(
                torch.cat([p.embedding for p in parts]),
                [torch.cat(layer) for layer in zip(*(p.extras for p in parts))],
            )
            self.cache.put(key, combined)
            self._pin_until(req, key, req.mm_items[-1].end, hi)
        for req, _ in missing.values():  # a miss encodes every item, needed in this chunk or not
            for item in req.mm_items:
                req.mm_sources.setdefault(item.hash, "encoded")
        for _, req, item, _, _ in needed:
            req.mm_sources.setdefault(item.hash, "embedding_cache")
        return {**found, **encoded}

    def _pin_until(self, req: Req, key: int, end: int, chunk_end: int) -> None:
        """Keep ``key`` cached while ``req`` still has placeholders of it beyond this chunk."""
        if end > chunk_end and key not in req.pins and key in self.cache:
            self.cache.pin(key)
            req.pins[key] = end

    def _encode(self, items: list[MultimodalItem]) -> dict[int, CachedEmbedding]:
        """Encode ``items``: on the encoder-only workers if any, and what they do not return
        here, in sub-batches of at most ``encoder_token_budget`` tokens and of one item
        context each: the contexts of a call are concatenated like its features, which
        reads right only for equal ones (LLaVA-OneVision's ``batch_num_images`` counts images
        per prompt)."""
        results = self.remote.encode(items, self.dtype) if self.remote and items else {}
        batch: list[MultimodalItem] = []
        tokens = 0
        for item in sorted((it for it in items if it.hash not in results), key=_encode_key):
            full = tokens + item.num_tokens > self.encoder_token_budget
            if batch and (full or _encode_key(item) != _encode_key(batch[0])):
                results.update(self._encode_batch(batch))
                batch, tokens = [], 0
            batch.append(item)
            tokens += item.num_tokens
        if batch:
            results.update(self._encode_batch(batch))
        return results

    def _encode_batch(self, items: list[MultimodalItem]) -> dict[int, CachedEmbedding]:
        start = time.perf_counter()
        self.preprocess(items)
        features = _move_items_to_device(items, self.device, self.dtype)
        encode = self.adapter.encode_videos if items[0].modality == "video" else self.adapter.encode
        with torch.no_grad():
            entries = encode(features, [item.num_tokens for item in items])
        results = {}
        for item, entry in zip(items, entries):
            if entry.num_tokens != item.num_tokens:
                raise RuntimeError(
                    f"vision encoder gave {entry.num_tokens} tokens for an image with "
                    f"{item.num_tokens} placeholders"
                )
            results[item.hash] = CachedEmbedding(
                entry.embedding.to(self.dtype), [t.to(self.dtype) for t in entry.extras]
            ).owned()
        for item in items:
            if item.modality == "video":
                item.features = None  # remade from the frames if the embedding is ever missing
        wait_for_device(self.device)  # the encoder's time, not its launches'
        elapsed = time.perf_counter() - start
        tokens = sum(item.num_tokens for item in items)
        self.stats.encoder_calls += 1
        self.stats.encoded_items += len(items)
        self.stats.encoded_tokens += tokens
        self.stats.encoder_seconds += elapsed
        self.stats.max_call_tokens = max(self.stats.max_call_tokens, tokens)
        logger.debug(
            "encoder call: %d items, %d tokens, %.1f ms", len(items), tokens, elapsed * 1e3
        )
        return results

    def release(self, req: Req, computed_len: int | None = None) -> None:
        """Drop the pins of ``req`` whose placeholders are all computed (every pin when None);
        at the end of a request, count the images it never had to preprocess."""
        for key, end in list(req.pins.items()):
            if computed_len is None or end <= computed_len:
                self.cache.unpin(key)
                del req.pins[key]
        if computed_len is None:
            self.stats.preprocess_skipped += sum(
                item.features is None for item in req.mm_items if item.modality == "image"
            )


def _encode_key(item: MultimodalItem) -> tuple[str, bytes]:
    return item.modality, context_key(item.context)


def _on_device(entry: CachedEmbedding, device: str) -> CachedEmbedding:
    if torch.device(device).type == "cpu":
        return entry
    return CachedEmbedding(entry.embedding.to(device), [t.to(device) for t in entry.extras])


def _take_rows(entry: CachedEmbedding, rows: np.ndarray) -> CachedEmbedding:
    if len(rows) == entry.num_tokens:
        return entry
    index = torch.as_tensor(rows, device=entry.embedding.device)
    return CachedEmbedding(entry.embedding[index], [t[index] for t in entry.extras])


def _combined_key(items: list[MultimodalItem]) -> int:
    return content_hash(*(item.hash.to_bytes(8, "little") for item in items))


def _split_combined(
    entry: CachedEmbedding, items: list[MultimodalItem]
) -> dict[int, CachedEmbedding]:
    out, row = {}, 0
    for item in items:
        rows = slice(row, row + item.num_tokens)
        out[item.hash] = CachedEmbedding(entry.embedding[rows], [t[rows] for t in entry.extras])
        row += item.num_tokens
    return out
