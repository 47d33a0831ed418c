#include "trident/parallel/mesh.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

constexpr const char* kAxisName[3] = {"tp", "dp", "pp"};

int size_of(const MeshShape& s, int axis) { return axis == 0 ? s.tp : axis == 1 ? s.dp : s.pp; }
int& coord_of(MeshCoord& c, int axis) { return axis == 0 ? c.tp : axis == 1 ? c.dp : c.pp; }
int coord_of(const MeshCoord& c, int axis) { return axis == 0 ? c.tp : axis == 1 ? c.dp : c.pp; }

// Every group of ranks that differ only along `axes` (listed fastest-varying first), one per combination of
// the other coordinates, enumerated in world-rank order of their first member. Members are ordered by their
// coordinates along `axes` (first axis fastest), so group rank = c[axes0] + n0 * c[axes1].
std::vector<std::vector<int>> groups_along(const MeshShape& s, const std::vector<int>& axes) {
  std::vector<std::vector<int>> out;
  const int world = s.tp * s.pp * s.dp;
  std::vector<bool> seen(static_cast<size_t>(world), false);
  for (int r = 0; r < world; ++r) {
    if (seen[static_cast<size_t>(r)]) continue;
    MeshCoord base = mesh_coord(s, r);
    std::vector<int> members;
    int n0 = size_of(s, axes[0]);
    int n1 = axes.size() > 1 ? size_of(s, axes[1]) : 1;
    for (int j = 0; j < n1; ++j) {
      for (int i = 0; i < n0; ++i) {
        MeshCoord c = base;
        coord_of(c, axes[0]) = i;
        if (axes.size() > 1) coord_of(c, axes[1]) = j;
        int m = mesh_rank(s, c);
        members.push_back(m);
        seen[static_cast<size_t>(m)] = true;
      }
    }
    out.push_back(std::move(members));
  }
  return out;
}

std::string join(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, ",")); }

}  // namespace

std::array<int, 3> parse_mesh_order(const std::string& order) {
  std::array<int, 3> axes{-1, -1, -1};
  std::vector<std::string> parts;
  std::stringstream in(order);
  std::string p;
  while (std::getline(in, p, '-')) parts.push_back(p);
  bool ok = parts.size() == 3;
  for (size_t i = 0; ok && i < 3; ++i) {
    int a = -1;
    for (int k = 0; k < 3; ++k)
      if (parts[i] == kAxisName[k]) a = k;
    if (a < 0 || std::find(axes.begin(), axes.end(), a) != axes.end()) ok = false;
    else axes[i] = a;
  }
  if (!ok) {
    TRIDENT_THROW(InvalidArgument,
                  "mesh order '{}': expected a permutation of tp, dp and pp joined by '-', innermost (adjacent "
                  "ranks) first, e.g. tp-dp-pp (the default) or dp-tp-pp",
                  order);
  }
  return axes;
}

void validate_mesh(const MeshShape& s, int world_size) {
  if (s.tp < 1 || s.pp < 1 || s.dp < 1) {
    TRIDENT_THROW(InvalidArgument, "mesh tp={} pp={} dp={}: every size must be at least 1", s.tp, s.pp, s.dp);
  }
  parse_mesh_order(s.order);
  const long long product = static_cast<long long>(s.tp) * s.pp * s.dp;
  if (product != world_size) {
    std::string hint;
    if (world_size % (s.tp * s.pp) == 0) hint = fmt::format("; with tp={} pp={} use dp={}", s.tp, s.pp, world_size / (s.tp * s.pp));
    TRIDENT_THROW(InvalidArgument, "mesh tp={} x pp={} x dp={} = {} ranks, but the world has {} ranks{}", s.tp, s.pp,
                  s.dp, product, world_size, hint);
  }
}

MeshCoord mesh_coord(const MeshShape& s, int world_rank) {
  auto axes = parse_mesh_order(s.order);
  MeshCoord c;
  int r = world_rank;
  for (int a : axes) {
    int n = size_of(s, a);
    coord_of(c, a) = r % n;
    r /= n;
  }
  return c;
}

int mesh_rank(const MeshShape& s, const MeshCoord& c) {
  auto axes = parse_mesh_order(s.order);
  int r = 0;
  for (int i = 2; i >= 0; --i) r = r * size_of(s, axes[static_cast<size_t>(i)]) + coord_of(c, axes[static_cast<size_t>(i)]);
  return r;
}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, MeshShape shape)
    : world_(std::move(world)), shape_(std::move(shape)) {
  TRIDENT_CHECK(world_ != nullptr, InvalidArgument, "DeviceMesh: the world group is null");
  validate_mesh(shape_, world_->size());
  coord_ = mesh_coord(shape_, world_->rank());
  // Every rank creates every group in the same order (new_group is collective in that sense); it keeps the
  // one it belongs to.
  auto make = [&](const std::vector<std::vector<int>>& groups, const char* prefix) {
    std::shared_ptr<ProcessGroup> mine;
    for (size_t i = 0; i < groups.size(); ++i) {
      auto g = world_->new_group(groups[i], fmt::format("{}{}", prefix, i));
      if (g) mine = g;
    }
    return mine;
  };
  tp_ = make(groups_along(shape_, {0}), "tp");
  dp_ = make(groups_along(shape_, {1}), "dp");
  pp_ = make(groups_along(shape_, {2}), "pp");
  mp_ = make(groups_along(shape_, {0, 2}), "mp");
  if (shape_.pp > 1) {
    std::vector<std::vector<int>> emb;
    for (auto& g : groups_along(shape_, {2})) emb.push_back({g.front(), g.back()});
    emb_ = make(emb, "emb");
  }
  TRIDENT_CHECK(tp_ && dp_ && pp_ && mp_, InvalidArgument, "DeviceMesh: rank {} is missing from a group of {}",
                world_->rank(), describe());
}

std::vector<int> DeviceMesh::tp_ranks() const {
  std::vector<int> v;
  for (int i = 0; i < shape_.tp; ++i) v.push_back(rank_of({i, coord_.dp, coord_.pp}));
  return v;
}
std::vector<int> DeviceMesh::pp_ranks() const {
  std::vector<int> v;
  for (int i = 0; i < shape_.pp; ++i) v.push_back(rank_of({coord_.tp, coord_.dp, i}));
  return v;
}
std::vector<int> DeviceMesh::dp_ranks() const {
  std::vector<int> v;
  for (int i = 0; i < shape_.dp; ++i) v.push_back(rank_of({coord_.tp, i, coord_.pp}));
  return v;
}
std::vector<int> DeviceMesh::model_parallel_ranks() const {
  std::vector<int> v;
  for (int p = 0; p < shape_.pp; ++p)
    for (int t = 0; t < shape_.tp; ++t) v.push_back(rank_of({t, coord_.dp, p}));
  return v;
}

std::string DeviceMesh::describe() const {
  return fmt::format("tp {} x pp {} x dp {} (order {}): rank {} = (tp {}, dp {}, pp {}); tp group [{}], pp group "
                     "[{}], dp group [{}]",
                     shape_.tp, shape_.pp, shape_.dp, shape_.order, world_->rank(), coord_.tp, coord_.dp, coord_.pp,
                     join(tp_ranks()), join(pp_ranks()), join(dp_ranks()));
}

}  // namespace trident::parallel
