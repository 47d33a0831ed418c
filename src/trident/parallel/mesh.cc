#include "trident/parallel/mesh.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trident/core/error.h"

namespace trident::parallel {
namespace {

std::string join(const std::vector<int>& v) { return fmt::format("{}", fmt::join(v, ",")); }

}  // namespace

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
  tp_ = make(mesh_groups_along(shape_, {0}), "tp");
  dp_ = make(mesh_groups_along(shape_, {1}), "dp");
  pp_ = make(mesh_groups_along(shape_, {2}), "pp");
  mp_ = make(mesh_groups_along(shape_, {0, 2}), "mp");
  if (shape_.pp > 1) {
    std::vector<std::vector<int>> emb;
    for (auto& g : mesh_groups_along(shape_, {2})) emb.push_back({g.front(), g.back()});
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
