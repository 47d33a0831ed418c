// The device mesh's shape and its arithmetic: the world's ranks laid out on a (tp, dp, pp) grid, and the
// pure functions between a rank and its coordinates (no process groups: parallel/mesh.h builds those).
//
// A rank's coordinates follow from its world rank and the axis order, innermost (stride 1) first. The
// default "tp-dp-pp" puts tensor-parallel peers on adjacent ranks (one NVLink node), data-parallel replicas
// next, pipeline stages outermost (Megatron-LM's order):
//   world_rank = tp_rank + tp * (dp_rank + dp * pp_rank)
// Kept apart from DeviceMesh so that what only checks or lays out a shape (the training config's
// validation, its fuzz target) needs the core layer alone.
#pragma once

#include <array>
#include <string>
#include <vector>

namespace trident::parallel {

struct MeshShape {
  int tp = 1, pp = 1, dp = 1;
  std::string order = "tp-dp-pp";  // innermost first: a permutation of tp, dp, pp joined by '-'
};

// Parses an order string ("tp-dp-pp", "dp-tp-pp", ...); returns the axes innermost first as 0=tp 1=dp 2=pp.
// Throws InvalidArgument naming the bad string and the allowed form.
std::array<int, 3> parse_mesh_order(const std::string& order);

// Checks the shape against a world size (product, positive sizes, order); throws InvalidArgument naming the
// numbers. Pure: no communication.
void validate_mesh(const MeshShape& shape, int world_size);

// Coordinates of `world_rank` and back (pure functions of the shape).
struct MeshCoord {
  int tp = 0, dp = 0, pp = 0;
};
MeshCoord mesh_coord(const MeshShape& shape, int world_rank);
int mesh_rank(const MeshShape& shape, const MeshCoord& c);

// Every group of ranks that differ only along `axes` (0=tp 1=dp 2=pp, listed fastest-varying first), one per
// combination of the other coordinates, in world-rank order of their first member. Members are ordered by
// their coordinates along `axes` (first axis fastest), so group rank = c[axes0] + n0 * c[axes1].
std::vector<std::vector<int>> mesh_groups_along(const MeshShape& shape, const std::vector<int>& axes);

}  // namespace trident::parallel
