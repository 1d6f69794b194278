#include "kv/radix_cache.h"

#include <algorithm>
#include <limits>
#include <queue>
#include <set>
#include <tuple>
#include <utility>

#include "core/check.h"

namespace oscar::kv {

bool RadixCache::PageKeyLess::operator()(std::span<const int32_t> a,
                                         std::span<const int32_t> b) const {
  return std::lexicographical_compare(a.begin(), a.end(), b.begin(), b.end());
}

RadixCache::RadixCache(int32_t page_size, std::vector<PagePool*> pools)
    : page_size_(page_size), pools_(std::move(pools)) {
  OSCAR_CHECK(page_size > 0, "radix cache: page_size %d must be > 0", page_size);
  OSCAR_CHECK(!pools_.empty() && pools_.size() <= kMaxCachePools, "radix cache: %zu pools",
              pools_.size());
  for (const PagePool* pool : pools_) OSCAR_CHECK(pool != nullptr, "radix cache: null pool");
  stats_.evicted_pages.assign(pools_.size(), 0);
  stats_.cached_pages.assign(pools_.size(), 0);
  stats_.evictable_pages.assign(pools_.size(), 0);
  auto root = std::make_unique<Node>();
  root->id = 0;
  root_ = root.get();
  nodes_.emplace(0, std::move(root));
}

namespace {
// fn(page) for every form of every chunk.
template <typename Fn>
void for_each_form(std::span<const CachedChunk> chunks, Fn&& fn) {
  for (const CachedChunk& chunk : chunks) {
    for (uint8_t pool = 0; pool < kMaxCachePools; ++pool)
      if (chunk.has(pool)) fn(chunk.form(pool));
  }
}
}  // namespace

RadixCache::~RadixCache() {
  for (auto& [id, node] : nodes_) {
    for_each_form(node->chunks, [&](CachedPage page) { pools_[page.pool]->release(page.page); });
    if (node->snapshot >= 0) states_->release(node->snapshot);
  }
}

void RadixCache::attach_state_pool(StatePool* states, int32_t max_snapshots) {
  OSCAR_CHECK(states != nullptr && max_snapshots >= 1,
              "radix cache: attach_state_pool with %d snapshots", max_snapshots);
  OSCAR_CHECK(states_ == nullptr && nodes_.size() == 1,
              "radix cache: attach_state_pool on a cache in use");
  states_ = states;
  max_snapshots_ = max_snapshots;
}

RadixCache::Node* RadixCache::find_node(NodeHandle handle) const {
  auto it = nodes_.find(handle.id);
  OSCAR_CHECK(it != nodes_.end(), "radix cache: stale node handle %llu",
              static_cast<unsigned long long>(handle.id));
  return it->second.get();
}

RadixCache::Node* RadixCache::new_node(Node* parent) {
  auto node = std::make_unique<Node>();
  node->id = next_id_++;
  node->parent = parent;
  Node* raw = node.get();
  nodes_.emplace(raw->id, std::move(node));
  ++stats_.n_nodes;
  return raw;
}

void RadixCache::add_gauges(const Node* node, int64_t cached_delta, int64_t evictable_delta) {
  for_each_form(node->chunks, [&](CachedPage page) {
    stats_.cached_pages[page.pool] += cached_delta;
    stats_.evictable_pages[page.pool] += evictable_delta;
  });
}

void RadixCache::touch(Node* node) {
  const uint64_t now = ++clock_;
  for (Node* n = node; n != nullptr; n = n->parent) n->last_access = now;
}

size_t RadixCache::match_pages(const Node* node, std::span<const int32_t> tokens) const {
  const size_t p = static_cast<size_t>(page_size_);
  size_t k = 0;
  while (k < node->chunks.size() && (k + 1) * p <= tokens.size() &&
         std::equal(tokens.begin() + k * p, tokens.begin() + (k + 1) * p,
                    node->tokens.begin() + k * p)) {
    ++k;
  }
  return k;
}

RadixCache::Node* RadixCache::split(Node* node, size_t n_pages) {
  OSCAR_CHECK(n_pages > 0 && n_pages < node->chunks.size(), "radix cache: split at %zu of %zu",
              n_pages, node->chunks.size());
  const size_t p = static_cast<size_t>(page_size_);
  Node* parent = node->parent;
  Node* upper = new_node(parent);
  upper->tokens.assign(node->tokens.begin(), node->tokens.begin() + n_pages * p);
  upper->chunks.assign(node->chunks.begin(), node->chunks.begin() + n_pages);
  if (!node->digests.empty()) {  // a listener is attached: the digests move with their pages
    upper->digests.assign(node->digests.begin(), node->digests.begin() + n_pages);
    node->digests.erase(node->digests.begin(), node->digests.begin() + n_pages);
  }
  // Every lock on node also covers its new ancestor; the pages just move, so gauges are unchanged.
  upper->lock_count = node->lock_count;
  upper->last_access = node->last_access;
  // The snapshot describes node's end, which stays node's: the upper node has none, and leads to
  // exactly the snapshots node leads to.
  upper->n_snapshots_below = node->n_snapshots_below;
  node->tokens.erase(node->tokens.begin(), node->tokens.begin() + n_pages * p);
  node->chunks.erase(node->chunks.begin(), node->chunks.begin() + n_pages);
  // The first page is unchanged, so the parent's key for this edge stays the same.
  auto it = parent->children.find(std::span<const int32_t>(upper->tokens).first(p));
  OSCAR_CHECK(it != parent->children.end() && it->second == node, "radix cache: split lost edge");
  it->second = upper;
  upper->children.emplace(std::vector<int32_t>(node->tokens.begin(), node->tokens.begin() + p),
                          node);
  node->parent = upper;
  return upper;
}

PrefixMatch RadixCache::match_prefix(std::span<const int32_t> tokens, const FormChooser& choose) {
  const size_t p = static_cast<size_t>(page_size_);
  // Every chunk along the path, read without changing the tree.
  std::vector<CachedChunk> found;
  std::vector<size_t> cuts;  // hybrid mode: chunk counts at which a snapshot was matched
  for (const Node* node = root_; tokens.size() - found.size() * p >= p;) {
    const std::span<const int32_t> rest = tokens.subspan(found.size() * p);
    auto it = node->children.find(rest.first(p));
    if (it == node->children.end()) break;
    const size_t k = match_pages(it->second, rest);
    found.insert(found.end(), it->second->chunks.begin(), it->second->chunks.begin() + k);
    if (k < it->second->chunks.size()) break;
    node = it->second;
    if (node->snapshot >= 0) cuts.push_back(found.size());
  }
  auto pick = [&](std::span<const CachedChunk> chunks) {
    if (choose) return choose(chunks);
    std::vector<CachedPage> pages;
    for (const CachedChunk& chunk : chunks) pages.push_back(chunk.form(chunk.has(0) ? 0 : 1));
    return pages;
  };
  PrefixMatch match;
  match.n_tokens_cached = static_cast<int64_t>(found.size() * p);
  if (states_ == nullptr) {
    match.pages = pick(found);
  } else {
    // Only a prefix that ends at a snapshot can be served, and only whole: the deepest one whose
    // chunks the chooser takes in full.
    for (auto cut = cuts.rbegin(); cut != cuts.rend(); ++cut) {
      std::vector<CachedPage> pages = pick(std::span<const CachedChunk>(found).first(*cut));
      if (pages.size() == *cut) {
        match.pages = std::move(pages);
        break;
      }
    }
  }
  OSCAR_CHECK(match.pages.size() <= found.size(), "radix cache: %zu forms chosen of %zu chunks",
              match.pages.size(), found.size());
  for (size_t i = 0; i < match.pages.size(); ++i) {
    const CachedPage page = match.pages[i];
    OSCAR_CHECK(
        page.pool < kMaxCachePools && found[i].has(page.pool) && found[i].form(page.pool) == page,
        "radix cache: chosen page %zu is not a form of its chunk", i);
  }
  // The chosen prefix: split where it ends inside an edge.
  const std::span<const int32_t> used = tokens.first(match.pages.size() * p);
  Node* node = root_;
  size_t pos = 0;
  while (pos < used.size()) {
    Node* child = node->children.find(used.subspan(pos, p))->second;
    const size_t k = match_pages(child, used.subspan(pos));
    if (k < child->chunks.size()) child = split(child, k);
    pos += k * p;
    node = child;
  }
  touch(node);
  match.n_tokens_matched = static_cast<int64_t>(pos);
  match.last_node = NodeHandle{node->id};
  if (states_ != nullptr && node != root_) {
    OSCAR_CHECK(node->snapshot >= 0, "radix cache: hybrid match ends at a node without a state");
    node->snapshot_access = clock_;
    match.state_slot = node->snapshot;
  }
  ++stats_.lookups;
  stats_.lookup_tokens += static_cast<int64_t>(tokens.size());
  stats_.matched_tokens += match.n_tokens_matched;
  if (match.n_tokens_matched > 0) {
    ++stats_.hits;
  } else {
    ++stats_.misses;
  }
  return match;
}

InsertResult RadixCache::insert(std::span<const int32_t> tokens,
                                std::span<const CachedPage> pages) {
  const size_t p = static_cast<size_t>(page_size_);
  OSCAR_CHECK(tokens.size() == pages.size() * p,
              "radix cache: insert of %zu tokens with %zu pages (page_size %d)", tokens.size(),
              pages.size(), page_size_);
  for (const CachedPage& page : pages) {
    OSCAR_CHECK(page.pool < pools_.size(), "radix cache: pool index %d of %zu", page.pool,
                pools_.size());
    OSCAR_CHECK(page.page != kNoPage && pools_[page.pool]->refcount(page.page) > 0,
                "radix cache: insert of page %d that the caller does not hold (pool %s)", page.page,
                pools_[page.pool]->name().c_str());
  }
  InsertResult result;
  result.cached_pages.reserve(pages.size());
  Node* node = root_;
  size_t pos = 0;
  while (pos < tokens.size()) {
    auto it = node->children.find(tokens.subspan(pos, p));
    if (it == node->children.end()) {
      // The rest is new: one leaf adopts the caller's pages.
      Node* leaf = new_node(node);
      leaf->tokens.assign(tokens.begin() + pos, tokens.end());
      for (const CachedPage& page : pages.subspan(pos / p)) {
        pools_[page.pool]->retain(page.page);
        leaf->chunks.emplace_back().pages[page.pool] = page.page;
        result.cached_pages.push_back(page);
      }
      add_gauges(leaf, +1, +1);
      result.n_pages_adopted += static_cast<int64_t>(leaf->chunks.size());
      stats_.cached_chunks += static_cast<int64_t>(leaf->chunks.size());
      node->children.emplace(std::vector<int32_t>(leaf->tokens.begin(), leaf->tokens.begin() + p),
                             leaf);
      if (announced(leaf)) hash_and_announce(leaf);
      node = leaf;
      pos = tokens.size();
      break;
    }
    Node* child = it->second;
    const size_t k = match_pages(child, tokens.subspan(pos));
    OSCAR_CHECK(k >= 1, "radix cache: child key matched but its first page did not");
    if (k < child->chunks.size()) child = split(child, k);
    // The chunks are cached; each one not held in the caller's page's form adopts that page.
    for (size_t j = 0; j < k; ++j) {
      const CachedPage page = pages[pos / p + j];
      CachedChunk& chunk = child->chunks[j];
      if (!chunk.has(page.pool)) {
        pools_[page.pool]->retain(page.page);
        chunk.pages[page.pool] = page.page;
        stats_.cached_pages[page.pool] += 1;
        if (child->lock_count == 0) stats_.evictable_pages[page.pool] += 1;
        result.n_pages_adopted += 1;
      }
      result.cached_pages.push_back(chunk.form(page.pool));
    }
    result.n_tokens_existing += static_cast<int64_t>(k * p);
    pos += k * p;
    node = child;
  }
  touch(node);
  result.last_node = NodeHandle{node->id};
  ++stats_.inserts;
  stats_.inserted_pages += result.n_pages_adopted;
  return result;
}

void RadixCache::lock(NodeHandle handle) {
  for (Node* n = find_node(handle); n != root_; n = n->parent) {
    if (n->lock_count++ == 0) add_gauges(n, 0, -1);
  }
}

void RadixCache::unlock(NodeHandle handle) {
  for (Node* n = find_node(handle); n != root_; n = n->parent) {
    OSCAR_CHECK(n->lock_count > 0, "radix cache: unlock of unlocked node %llu",
                static_cast<unsigned long long>(n->id));
    if (--n->lock_count == 0) add_gauges(n, 0, +1);
  }
}

int32_t RadixCache::lock_count(NodeHandle handle) const { return find_node(handle)->lock_count; }

bool RadixCache::release_cached(CachedPage page) {
  PagePool* pool = pools_[page.pool];
  const bool last = pool->refcount(page.page) == 1;
  pool->release(page.page);
  stats_.cached_pages[page.pool] -= 1;
  stats_.evictable_pages[page.pool] -= 1;  // only unlocked nodes are evicted
  stats_.evicted_pages[page.pool] += 1;
  return last;
}

int64_t RadixCache::release_chunk(const CachedChunk& chunk, uint8_t pool) {
  --stats_.cached_chunks;
  int64_t freed = 0;
  for_each_form(std::span(&chunk, 1),
                [&](CachedPage page) { freed += release_cached(page) && page.pool == pool; });
  return freed;
}

void RadixCache::remove_leaf(Node* node) {
  OSCAR_CHECK(
      node != root_ && node->children.empty() && node->lock_count == 0 &&
          !node->chunks.empty() && node->snapshot < 0,
      "radix cache: remove_leaf on node %llu", static_cast<unsigned long long>(node->id));
  Node* parent = node->parent;
  auto it = parent->children.find(std::span<const int32_t>(node->tokens).first(page_size_));
  OSCAR_CHECK(it != parent->children.end() && it->second == node,
              "radix cache: leaf %llu missing from its parent",
              static_cast<unsigned long long>(node->id));
  parent->children.erase(it);
  nodes_.erase(node->id);
  --stats_.n_nodes;
  ++stats_.evicted_nodes;
}

bool RadixCache::worth_evicting(const Node* node, uint8_t pool) const {
  // Evicting below node can reach pages of `pool` only if node or one of its unlocked ancestors
  // (they can become leaves in turn; locked ones never can) holds such a page.
  for (const Node* n = node; n != root_ && n->lock_count == 0; n = n->parent) {
    for (const CachedChunk& chunk : n->chunks) {
      if (chunk.has(pool)) return true;
    }
  }
  return false;
}

int64_t RadixCache::evict(int64_t n_pages_needed, uint8_t pool) {
  OSCAR_CHECK(pool < pools_.size(), "radix cache: evict from pool index %d of %zu", pool,
              pools_.size());
  OSCAR_CHECK(n_pages_needed >= 0, "radix cache: evict(%lld)",
              static_cast<long long>(n_pages_needed));
  return evict_impl(n_pages_needed, pool, /*any_leaf=*/false);
}

void RadixCache::evict_all_unlocked() {
  evict_impl(std::numeric_limits<int64_t>::max(), 0, /*any_leaf=*/true);
}

int64_t RadixCache::evict_impl(int64_t n_pages_needed, uint8_t pool, bool any_leaf) {
  if (n_pages_needed == 0) return 0;
  const size_t p = static_cast<size_t>(page_size_);
  // Min-heap of unlocked leaves by (has a snapshot, last access, id): least recently used first,
  // ties by age; in hybrid mode the leaves without a state snapshot (they serve no hit) before
  // all others.
  using Entry = std::tuple<bool, uint64_t, uint64_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto push = [&](const Node* n) { heap.emplace(n->snapshot >= 0, n->last_access, n->id); };
  for (const auto& [id, node] : nodes_) {
    if (node.get() != root_ && node->children.empty() && node->lock_count == 0) push(node.get());
  }
  int64_t freed = 0;
  std::vector<BlockHash> removed;  // this leaf's pages, for the listener
  while (freed < n_pages_needed && !heap.empty()) {
    Node* leaf = nodes_.at(std::get<2>(heap.top())).get();
    heap.pop();
    // Trim from the tail (the deepest, least shared tokens) while that can still free pages of
    // `pool`: the leaf's remaining pages hold some, or an unlocked ancestor does.
    const bool ancestors_have = any_leaf || worth_evicting(leaf->parent, pool);
    int64_t leaf_has = std::count_if(leaf->chunks.begin(), leaf->chunks.end(),
                                     [&](const CachedChunk& chunk) { return chunk.has(pool); });
    removed.clear();
    // Trimming the leaf's tail invalidates the state after it (its blocks removed first).
    if (leaf->snapshot >= 0 && (ancestors_have || leaf_has > 0)) drop_snapshot(leaf);
    while (freed < n_pages_needed && (ancestors_have || leaf_has > 0)) {
      if (announced(leaf)) removed.push_back(external_block_hash(leaf->digests.back()));
      if (leaf->chunks.size() > 1) {
        const CachedChunk chunk = leaf->chunks.back();
        if (chunk.has(pool)) --leaf_has;
        freed += release_chunk(chunk, pool);
        leaf->chunks.pop_back();
        leaf->tokens.resize(leaf->chunks.size() * p);
        if (announced(leaf)) leaf->digests.pop_back();
        continue;
      }
      // The last chunk keys the edge in the parent: release it and drop the node.
      freed += release_chunk(leaf->chunks.front(), pool);
      Node* parent = leaf->parent;
      remove_leaf(leaf);
      if (parent != root_ && parent->children.empty() && parent->lock_count == 0) push(parent);
      break;
    }
    // One BlockRemoved per trimmed leaf, deepest page first.
    if (listener_ != nullptr && !removed.empty()) listener_->on_removed(removed);
  }
  return freed;
}

void RadixCache::count_snapshot(Node* node) {
  std::vector<Node*> fresh;  // nodes that lead to their first snapshot, deepest first
  for (Node* n = node; n != root_; n = n->parent)
    if (n->n_snapshots_below++ == 0) fresh.push_back(n);
  if (listener_ == nullptr) return;
  for (auto it = fresh.rbegin(); it != fresh.rend(); ++it) hash_and_announce(*it);
}

void RadixCache::drop_snapshot(Node* node) {
  OSCAR_CHECK(node->snapshot >= 0, "radix cache: node %llu has no snapshot to drop",
              static_cast<unsigned long long>(node->id));
  states_->release(node->snapshot);
  node->snapshot = -1;
  --stats_.snapshots;
  ++stats_.evicted_snapshots;
  // Deepest first: the blocks of each node that no longer leads to a snapshot.
  for (Node* n = node; n != root_; n = n->parent) {
    if (--n->n_snapshots_below > 0 || listener_ == nullptr) continue;
    std::vector<BlockHash> removed;
    for (auto d = n->digests.rbegin(); d != n->digests.rend(); ++d)
      removed.push_back(external_block_hash(*d));
    n->digests = {};
    if (!removed.empty()) listener_->on_removed(removed);
  }
}

bool RadixCache::store_snapshot(std::span<const int32_t> tokens, int32_t src) {
  OSCAR_CHECK(states_ != nullptr, "radix cache: store_snapshot without a state pool");
  const size_t p = static_cast<size_t>(page_size_);
  OSCAR_CHECK(!tokens.empty() && tokens.size() % p == 0,
              "radix cache: snapshot after %zu tokens (page_size %d)", tokens.size(), page_size_);
  // The node whose path is exactly `tokens`, splitting where it ends inside an edge.
  Node* node = root_;
  size_t pos = 0;
  while (pos < tokens.size()) {
    auto it = node->children.find(tokens.subspan(pos, p));
    if (it == node->children.end()) return false;
    Node* child = it->second;
    const size_t k = match_pages(child, tokens.subspan(pos));
    if (k < child->chunks.size()) {
      if (pos + k * p < tokens.size()) return false;  // diverges inside the edge
      child = split(child, k);
    }
    pos += k * p;
    node = child;
  }
  touch(node);
  node->snapshot_access = clock_;
  if (node->snapshot >= 0) return true;
  if (stats_.snapshots >= max_snapshots_) {
    // The least recently stored or matched snapshot makes room (never node's ancestors' path
    // matters: a snapshot serves alone).
    Node* lru = nullptr;
    for (const auto& [id, n] : nodes_)
      if (n->snapshot >= 0 && (lru == nullptr || n->snapshot_access < lru->snapshot_access))
        lru = n.get();
    OSCAR_CHECK(lru != nullptr, "radix cache: %lld snapshots counted, none found",
                static_cast<long long>(stats_.snapshots));
    drop_snapshot(lru);
  }
  auto slot = states_->acquire();
  if (!slot.ok()) return false;
  states_->copy_slot(slot.value(), src);
  node->snapshot = slot.value();
  ++stats_.snapshots;
  ++stats_.stored_snapshots;
  count_snapshot(node);
  return true;
}

void RadixCache::reset() {
  for (const auto& [id, node] : nodes_) {
    OSCAR_CHECK(node->lock_count == 0, "radix cache: reset with node %llu locked (%d)",
                static_cast<unsigned long long>(id), node->lock_count);
  }
  for (auto& [id, node] : nodes_) {
    for_each_form(node->chunks, [&](CachedPage page) { pools_[page.pool]->release(page.page); });
    if (node->snapshot >= 0) {
      states_->release(node->snapshot);
      ++stats_.evicted_snapshots;
    }
  }
  std::unique_ptr<Node> root = std::move(nodes_.at(0));
  nodes_.clear();
  root->children.clear();
  root->last_access = 0;
  root_ = root.get();
  nodes_.emplace(0, std::move(root));
  std::fill(stats_.cached_pages.begin(), stats_.cached_pages.end(), 0);
  std::fill(stats_.evictable_pages.begin(), stats_.evictable_pages.end(), 0);
  stats_.n_nodes = 0;
  stats_.cached_chunks = 0;
  stats_.snapshots = 0;
  if (listener_ != nullptr) listener_->on_cleared();
}

void RadixCache::hash_and_announce(Node* node) {
  const BlockDigest* parent =
      node->parent == root_ ? &root_block_digest() : &node->parent->digests.back();
  const std::optional<BlockHash> parent_hash =
      node->parent == root_ ? std::nullopt : std::optional<BlockHash>(external_block_hash(*parent));
  const size_t p = static_cast<size_t>(page_size_);
  node->digests.clear();
  node->digests.reserve(node->chunks.size());
  std::vector<BlockHash> hashes;
  hashes.reserve(node->chunks.size());
  for (size_t k = 0; k < node->chunks.size(); ++k) {
    node->digests.push_back(
        chain_block_digest(node->digests.empty() ? *parent : node->digests.back(),
                           std::span<const int32_t>(node->tokens).subspan(k * p, p)));
    hashes.push_back(external_block_hash(node->digests.back()));
  }
  listener_->on_stored(hashes, parent_hash, node->tokens, page_size_);
}

void RadixCache::set_listener(KvEventListener* listener) {
  listener_ = listener;
  if (listener_ == nullptr) {
    for (auto& [id, node] : nodes_) node->digests = {};
    return;
  }
  listener_->on_cleared();
  // Parents first: a node's digests are ready before its children chain from them. (In hybrid
  // mode a node that is not announced has no announced descendant either.)
  std::vector<Node*> stack;
  for (const auto& [key, child] : root_->children) stack.push_back(child);
  while (!stack.empty()) {
    Node* node = stack.back();
    stack.pop_back();
    if (!announced(node)) {
      node->digests = {};
      continue;
    }
    hash_and_announce(node);
    for (const auto& [key, child] : node->children) stack.push_back(child);
  }
}

void RadixCache::reset_stats() {
  RadixCacheStats fresh;
  fresh.evicted_pages.assign(pools_.size(), 0);
  fresh.cached_pages = stats_.cached_pages;
  fresh.evictable_pages = stats_.evictable_pages;
  fresh.n_nodes = stats_.n_nodes;
  fresh.cached_chunks = stats_.cached_chunks;
  fresh.snapshots = stats_.snapshots;
  stats_ = std::move(fresh);
}

void RadixCache::retain_pages(std::span<const CachedPage> pages) {
  for (const CachedPage& page : pages) {
    OSCAR_CHECK(page.pool < pools_.size(), "radix cache: pool index %d", page.pool);
    pools_[page.pool]->retain(page.page);
  }
}

void RadixCache::release_pages(std::span<const CachedPage> pages) {
  for (const CachedPage& page : pages) {
    OSCAR_CHECK(page.pool < pools_.size(), "radix cache: pool index %d", page.pool);
    pools_[page.pool]->release(page.page);
  }
}

void RadixCache::for_each_page(
    const std::function<void(std::span<const int32_t> prefix, CachedPage page)>& fn) const {
  const size_t p = static_cast<size_t>(page_size_);
  std::vector<int32_t> path;
  // Depth-first with an explicit stack of (node, path length before its edge).
  std::vector<std::pair<const Node*, size_t>> stack{{root_, 0}};
  while (!stack.empty()) {
    auto [node, base] = stack.back();
    stack.pop_back();
    path.resize(base);
    for (size_t k = 0; k < node->chunks.size(); ++k) {
      path.insert(path.end(), node->tokens.begin() + k * p, node->tokens.begin() + (k + 1) * p);
      for_each_form(std::span(&node->chunks[k], 1), [&](CachedPage page) { fn(path, page); });
    }
    for (const auto& [key, child] : node->children) stack.emplace_back(child, path.size());
  }
}

void RadixCache::for_each_snapshot(
    const std::function<void(std::span<const int32_t> prefix, int32_t slot)>& fn) const {
  std::vector<std::pair<const Node*, std::vector<int32_t>>> stack{{root_, {}}};
  while (!stack.empty()) {
    auto [node, path] = std::move(stack.back());
    stack.pop_back();
    path.insert(path.end(), node->tokens.begin(), node->tokens.end());
    if (node->snapshot >= 0) fn(path, node->snapshot);
    for (const auto& [key, child] : node->children) stack.emplace_back(child, path);
  }
}

void RadixCache::check_invariants() const {
  const size_t p = static_cast<size_t>(page_size_);
  std::vector<int64_t> cached(pools_.size(), 0);
  std::vector<int64_t> evictable(pools_.size(), 0);
  int64_t n_reached = 0, n_chunks = 0;
  std::set<int32_t> snapshot_slots;
  std::vector<const Node*> stack{root_};
  OSCAR_CHECK(root_->chunks.empty() && root_->tokens.empty() && root_->parent == nullptr &&
                  root_->lock_count == 0,
              "radix cache: bad root");
  while (!stack.empty()) {
    const Node* node = stack.back();
    stack.pop_back();
    if (node != root_) {
      ++n_reached;
      OSCAR_CHECK(!node->chunks.empty() && node->tokens.size() == node->chunks.size() * p,
                  "radix cache: node %llu has %zu tokens and %zu chunks",
                  static_cast<unsigned long long>(node->id), node->tokens.size(),
                  node->chunks.size());
      OSCAR_CHECK(node->lock_count >= 0, "radix cache: negative lock count");
      auto it = nodes_.find(node->id);
      OSCAR_CHECK(it != nodes_.end() && it->second.get() == node, "radix cache: unlisted node");
      for (const CachedChunk& chunk : node->chunks) {
        OSCAR_CHECK(chunk.has(0) || chunk.has(1), "radix cache: a chunk without a page");
      }
      n_chunks += static_cast<int64_t>(node->chunks.size());
      for_each_form(node->chunks, [&](CachedPage page) {
        OSCAR_CHECK(page.pool < pools_.size(), "radix cache: pool index %d", page.pool);
        OSCAR_CHECK(pools_[page.pool]->refcount(page.page) >= 1,
                    "radix cache: cached page %d of pool %s is free", page.page,
                    pools_[page.pool]->name().c_str());
        ++cached[page.pool];
        if (node->lock_count == 0) ++evictable[page.pool];
      });
    }
    int32_t below = node->snapshot >= 0 ? 1 : 0;
    if (node->snapshot >= 0) {
      OSCAR_CHECK(states_ != nullptr && node != root_, "radix cache: a snapshot without a pool");
      OSCAR_CHECK(snapshot_slots.insert(node->snapshot).second,
                  "radix cache: snapshot slot %d held twice", node->snapshot);
    }
    if (node != root_ && listener_ != nullptr)
      OSCAR_CHECK(node->digests.size() == (announced(node) ? node->chunks.size() : 0),
                  "radix cache: node %llu has %zu digests for %zu chunks",
                  static_cast<unsigned long long>(node->id), node->digests.size(),
                  node->chunks.size());
    int64_t child_locks = 0;
    for (const auto& [key, child] : node->children) {
      below += child->n_snapshots_below;
      OSCAR_CHECK(child->parent == node, "radix cache: bad parent link");
      OSCAR_CHECK(key.size() == p && child->tokens.size() >= p &&
                      std::equal(key.begin(), key.end(), child->tokens.begin()),
                  "radix cache: child key differs from its first page");
      child_locks += child->lock_count;
      stack.push_back(child);
    }
    if (node != root_) {
      OSCAR_CHECK(node->n_snapshots_below == below,
                  "radix cache: node %llu counts %d snapshots below, holds %d",
                  static_cast<unsigned long long>(node->id), node->n_snapshots_below, below);
      OSCAR_CHECK(node->lock_count >= child_locks,
                  "radix cache: node %llu lock count %d < its children's %lld",
                  static_cast<unsigned long long>(node->id), node->lock_count,
                  static_cast<long long>(child_locks));
    }
  }
  OSCAR_CHECK(n_reached + 1 == static_cast<int64_t>(nodes_.size()) && n_reached == stats_.n_nodes,
              "radix cache: %lld nodes reachable, %zu listed, gauge %lld",
              static_cast<long long>(n_reached), nodes_.size(),
              static_cast<long long>(stats_.n_nodes));
  OSCAR_CHECK(cached == stats_.cached_pages, "radix cache: cached_pages gauge is off");
  OSCAR_CHECK(n_chunks == stats_.cached_chunks, "radix cache: cached_chunks gauge is off");
  OSCAR_CHECK(evictable == stats_.evictable_pages, "radix cache: evictable_pages gauge is off");
  OSCAR_CHECK(static_cast<int64_t>(snapshot_slots.size()) == stats_.snapshots &&
                  (states_ == nullptr || stats_.snapshots <= max_snapshots_),
              "radix cache: %zu snapshots held, gauge %lld, budget %d", snapshot_slots.size(),
              static_cast<long long>(stats_.snapshots), max_snapshots_);
}

}  // namespace oscar::kv
