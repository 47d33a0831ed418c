#include "trident/parallel/mesh_shape.h"

#include <algorithm>
#include <sstream>

#include <fmt/format.h>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

constexpr const char* kAxisName[3] = {"tp", "dp", "pp"};

int size_of(const MeshShape& s, int axis) { return axis == 0 ? s.tp : axis == 1 ? s.dp : s.pp; }
int& coord_of(MeshCoord& c, int axis) { return axis == 0 ? c.tp : axis == 1 ? c.dp : c.pp; }
int coord_of(const MeshCoord& c, int axis) { return axis == 0 ? c.tp : axis == 1 ? c.dp : c.pp; }

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

std::vector<std::vector<int>> mesh_groups_along(const MeshShape& s, const std::vector<int>& axes) {
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

}  // namespace trident::parallel
