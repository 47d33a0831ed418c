// DeviceMesh over real processes: coordinates are a bijection onto the world, each group holds exactly the
// ranks an independent enumeration expects (in coordinate order), and an all-reduce on each group sums
// exactly its members' values (2^rank, so any stray or missing member changes the sum).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "harness/multiproc.h"
#include "trident/comm/process_group.h"
#include "trident/comm/store/store.h"
#include "trident/core/error.h"
#include "trident/parallel/mesh.h"

namespace trident {
namespace {

using parallel::DeviceMesh;
using parallel::MeshCoord;
using parallel::MeshShape;

struct Layout {
  int tp, pp, dp;
  std::string order;
};

// Reference coordinates, written out independently of mesh.cc: strides from the order string.
MeshCoord ref_coord(const Layout& l, int r) {
  int size[3] = {l.tp, l.dp, l.pp};  // tp dp pp
  std::vector<int> axes;
  for (size_t p = 0; p < l.order.size(); p += 3) {
    std::string a = l.order.substr(p, 2);
    axes.push_back(a == "tp" ? 0 : a == "dp" ? 1 : 2);
  }
  int c[3] = {0, 0, 0};
  for (int a : axes) {
    c[a] = r % size[a];
    r /= size[a];
  }
  return {c[0], c[1], c[2]};
}

// The world ranks whose reference coordinates agree with `me` on every axis outside `free`, sorted by their
// coordinates along `free` (first listed axis fastest).
std::vector<int> ref_group(const Layout& l, int me, std::vector<int> free) {
  int world = l.tp * l.pp * l.dp;
  auto get = [](const MeshCoord& c, int a) { return a == 0 ? c.tp : a == 1 ? c.dp : c.pp; };
  MeshCoord m = ref_coord(l, me);
  std::vector<std::pair<int, int>> keyed;
  int n0 = free[0] == 0 ? l.tp : free[0] == 1 ? l.dp : l.pp;
  for (int r = 0; r < world; ++r) {
    MeshCoord c = ref_coord(l, r);
    bool same = true;
    for (int a = 0; a < 3; ++a)
      if (std::find(free.begin(), free.end(), a) == free.end() && get(c, a) != get(m, a)) same = false;
    if (!same) continue;
    int key = get(c, free[0]) + (free.size() > 1 ? n0 * get(c, free[1]) : 0);
    keyed.emplace_back(key, r);
  }
  std::sort(keyed.begin(), keyed.end());
  std::vector<int> out;
  for (auto& [k, r] : keyed) out.push_back(r);
  return out;
}

void check_group(const std::shared_ptr<ProcessGroup>& g, const std::vector<int>& want, int rank, const char* what) {
  TRIDENT_RANK_CHECK(g != nullptr, "{} group missing", what);
  TRIDENT_RANK_CHECK(g->size() == static_cast<int>(want.size()), "{} size {} want {}", what, g->size(), want.size());
  auto it = std::find(want.begin(), want.end(), rank);
  TRIDENT_RANK_CHECK(it != want.end(), "{}: rank not in its own expected group", what);
  TRIDENT_RANK_CHECK(g->rank() == static_cast<int>(it - want.begin()), "{} group rank {} want {}", what, g->rank(),
                     it - want.begin());
  for (int i = 0; i < g->size(); ++i)
    TRIDENT_RANK_CHECK(g->global_rank(i) == want[static_cast<size_t>(i)], "{} member {} is world {} want {}", what, i,
                       g->global_rank(i), want[static_cast<size_t>(i)]);
  // Sum of 2^member over the members: exact in int64, unique per member set.
  int64_t v = int64_t{1} << rank, expect = 0;
  for (int r : want) expect += int64_t{1} << r;
  g->all_reduce(&v, 1, DType::kInt64, ReduceOp::kSum);
  TRIDENT_RANK_CHECK(v == expect, "{} all_reduce sum {} want {}", what, v, expect);
  // And the group-rank ids gathered in order are 0..n-1 mapped to the expected world ranks.
  std::vector<int32_t> ids(want.size());
  int32_t mine = rank;
  g->all_gather(&mine, ids.data(), 1, DType::kInt32);
  for (size_t i = 0; i < ids.size(); ++i)
    TRIDENT_RANK_CHECK(ids[i] == want[i], "{} all_gather slot {} holds world rank {} want {}", what, i, ids[i], want[i]);
}

class Mesh : public ::testing::TestWithParam<Layout> {};

TEST_P(Mesh, GroupsAndCoordinates) {
  Layout l = GetParam();
  const int world = l.tp * l.pp * l.dp;
  // Bijection (pure functions, checked in the parent).
  MeshShape shape{l.tp, l.pp, l.dp, l.order};
  std::set<std::tuple<int, int, int>> seen;
  for (int r = 0; r < world; ++r) {
    MeshCoord c = parallel::mesh_coord(shape, r);
    MeshCoord want = ref_coord(l, r);
    EXPECT_EQ(std::make_tuple(c.tp, c.dp, c.pp), std::make_tuple(want.tp, want.dp, want.pp)) << "rank " << r;
    EXPECT_TRUE(seen.insert({c.tp, c.dp, c.pp}).second) << "coordinates repeat at rank " << r;
    EXPECT_EQ(parallel::mesh_rank(shape, c), r);
  }
  EXPECT_EQ(static_cast<int>(seen.size()), world);

  auto res = testing::run_processes(world, [l](int rank, int size, std::shared_ptr<Store> store) {
    GroupOptions o;
    o.timeout = Seconds(60);
    auto pg = new_process_group(store, rank, size, o);
    DeviceMesh mesh(pg, MeshShape{l.tp, l.pp, l.dp, l.order});
    MeshCoord want = ref_coord(l, rank);
    TRIDENT_RANK_CHECK(mesh.tp_rank() == want.tp && mesh.dp_rank() == want.dp && mesh.pp_rank() == want.pp,
                       "coords ({},{},{}) want ({},{},{})", mesh.tp_rank(), mesh.dp_rank(), mesh.pp_rank(), want.tp,
                       want.dp, want.pp);
    check_group(mesh.tp_group(), ref_group(l, rank, {0}), rank, "tp");
    check_group(mesh.dp_group(), ref_group(l, rank, {1}), rank, "dp");
    check_group(mesh.pp_group(), ref_group(l, rank, {2}), rank, "pp");
    check_group(mesh.model_parallel_group(), ref_group(l, rank, {0, 2}), rank, "model-parallel");
    TRIDENT_RANK_CHECK(mesh.pp_group()->rank() == mesh.pp_rank(), "pp group rank {} != pp_rank", mesh.pp_group()->rank());
    TRIDENT_RANK_CHECK(mesh.model_parallel_group()->rank() == mesh.pp_rank() * l.tp + mesh.tp_rank(),
                       "model-parallel group rank {}", mesh.model_parallel_group()->rank());
    bool edge = l.pp > 1 && (want.pp == 0 || want.pp == l.pp - 1);
    if (!edge) {
      TRIDENT_RANK_CHECK(mesh.embedding_group() == nullptr, "embedding group on a middle stage or pp=1");
    } else {
      auto pp = ref_group(l, rank, {2});
      check_group(mesh.embedding_group(), {pp.front(), pp.back()}, rank, "embedding");
    }
    pg->barrier();
  });
  EXPECT_EQ(testing::failures(res), "");
}

INSTANTIATE_TEST_SUITE_P(Layouts, Mesh,
                         ::testing::Values(Layout{1, 1, 1, "tp-dp-pp"}, Layout{2, 1, 1, "tp-dp-pp"},
                                           Layout{1, 2, 1, "tp-dp-pp"}, Layout{1, 3, 1, "tp-dp-pp"},
                                           Layout{1, 1, 3, "tp-dp-pp"}, Layout{2, 2, 1, "tp-dp-pp"},
                                           Layout{1, 2, 2, "dp-tp-pp"}, Layout{2, 2, 2, "tp-dp-pp"},
                                           Layout{2, 2, 2, "pp-dp-tp"}, Layout{2, 2, 2, "dp-pp-tp"},
                                           Layout{2, 4, 1, "tp-pp-dp"}),
                         [](const auto& info) {
                           const Layout& l = info.param;
                           std::string o = l.order;
                           std::replace(o.begin(), o.end(), '-', '_');
                           return fmt::format("tp{}_pp{}_dp{}_{}", l.tp, l.pp, l.dp, o);
                         });

TEST(MeshShapeCheck, RefusesBadShapes) {
  auto msg = [](const MeshShape& s, int world) {
    try {
      parallel::validate_mesh(s, world);
    } catch (const InvalidArgument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  std::string m = msg({2, 2, 1, "tp-dp-pp"}, 8);
  EXPECT_NE(m.find("tp=2 x pp=2 x dp=1 = 4"), std::string::npos) << m;
  EXPECT_NE(m.find("world has 8"), std::string::npos) << m;
  EXPECT_NE(m.find("dp=2"), std::string::npos) << m;
  m = msg({2, 1, 1, "tp-pp"}, 2);
  EXPECT_NE(m.find("'tp-pp'"), std::string::npos) << m;
  m = msg({2, 1, 1, "tp-tp-pp"}, 2);
  EXPECT_NE(m.find("permutation"), std::string::npos) << m;
  m = msg({0, 1, 1, "tp-dp-pp"}, 1);
  EXPECT_NE(m.find("at least 1"), std::string::npos) << m;
  EXPECT_EQ(msg({2, 2, 2, "pp-tp-dp"}, 8), "no error");
}

}  // namespace
}  // namespace trident
