// The dashboard's page, script and style (src/trident/dashboard/page/) and uPlot's script and style (npm's
// uplot, found under `npm root -g` when CMake configures; scripts/deps.sh installs it), embedded in the
// binary at build time by cmake/embed_assets.cmake, so `trident dashboard` and `trident report` need no
// files at run time. Without uPlot at configure time the two uPlot strings are empty and kHaveUplot false.
#pragma once

namespace trident::dashboard::assets {

extern const char kIndexHtml[];
extern const char kDashboardJs[];
extern const char kDashboardCss[];
extern const char kChartsJs[];     // the chart code both pages share
extern const char kFiguresHtml[];  // the figure pages' template (bench comm, plan, simulate --html)
extern const char kFiguresJs[];
extern const char kUplotJs[];
extern const char kUplotCss[];
extern const bool kHaveUplot;

}  // namespace trident::dashboard::assets
