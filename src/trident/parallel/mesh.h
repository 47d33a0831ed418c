// DeviceMesh: the world's ranks laid out on a (tp, dp, pp) grid, with one process group per axis.
//
// The shape, the axis order and the rank <-> coordinate arithmetic are in parallel/mesh_shape.h.
// Groups (each member ordered by its coordinate along the varying axes, so group rank == that coordinate):
//   tp_group            ranks differing only in tp (size tp)
//   pp_group            ranks differing only in pp (size pp; group rank == pp_rank)
//   dp_group            ranks differing only in dp (size dp)
//   model_parallel_group  ranks of my data-parallel replica (differing in tp and pp; size tp*pp; group
//                       rank == pp_rank * tp + tp_rank), the group a replica's model is gathered over
//   embedding_group     the first and the last pipeline stage with my tp and dp coordinates (size 2), for the
//                       tied embedding's gradient; null when pp == 1 or this rank is neither first nor last
// Every group exists as a ProcessGroup only on its members; other ranks hold nullptr for it (never the case
// for tp/pp/dp/model_parallel, which every rank belongs to).
//
// Ownership: the mesh shares the world group and owns its subgroups (shared_ptr, handed out).
// Blocking: the constructor is collective over the world (every rank constructs the mesh with the same
// shape, in the same order relative to other subgroup creations) and creates every group in the same
// order on every rank; it does not communicate. Thread-safety: const methods only after construction.
// Timeouts: the groups inherit the world group's timeout.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "trident/comm/process_group.h"
#include "trident/parallel/mesh_shape.h"

namespace trident::parallel {

class DeviceMesh {
 public:
  DeviceMesh(std::shared_ptr<ProcessGroup> world, MeshShape shape);

  const MeshShape& shape() const { return shape_; }
  int tp_rank() const { return coord_.tp; }
  int pp_rank() const { return coord_.pp; }
  int dp_rank() const { return coord_.dp; }
  int tp_size() const { return shape_.tp; }
  int pp_size() const { return shape_.pp; }
  int dp_size() const { return shape_.dp; }
  int world_rank() const { return world_->rank(); }
  int world_size() const { return world_->size(); }
  // World rank of the rank at coordinates c.
  int rank_of(const MeshCoord& c) const { return mesh_rank(shape_, c); }
  // World ranks of the members of each of my groups, in group-rank order.
  std::vector<int> tp_ranks() const;
  std::vector<int> pp_ranks() const;
  std::vector<int> dp_ranks() const;
  std::vector<int> model_parallel_ranks() const;

  std::shared_ptr<ProcessGroup> world() const { return world_; }
  std::shared_ptr<ProcessGroup> tp_group() const { return tp_; }
  std::shared_ptr<ProcessGroup> pp_group() const { return pp_; }
  std::shared_ptr<ProcessGroup> dp_group() const { return dp_; }
  std::shared_ptr<ProcessGroup> model_parallel_group() const { return mp_; }
  std::shared_ptr<ProcessGroup> embedding_group() const { return emb_; }

  std::string describe() const;  // "tp 2 x pp 2 x dp 2 (order tp-dp-pp): rank 5 = (tp 1, dp 0, pp 1)"

 private:
  std::shared_ptr<ProcessGroup> world_;
  MeshShape shape_;
  MeshCoord coord_;
  std::shared_ptr<ProcessGroup> tp_, pp_, dp_, mp_, emb_;
};

}  // namespace trident::parallel
