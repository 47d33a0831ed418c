// The one mechanism by which trident's HTML pages are put together: a template from dashboard/page/ with
// two markers (<!--trident:head--> for styles, <!--trident:scripts--> for scripts) filled either with links
// to the server's /assets/ (`trident dashboard`) or with the styles, uPlot, the shared chart code
// (page/charts.js), the page's data and its script inlined, so the file opens offline (`trident report`,
// and the figure pages of `trident bench comm --html`, `trident plan --html`, `trident simulate --html`).
//
// Pure functions of their arguments; thread-safe. Errors: inline_page() and render_figures() throw
// InvalidArgument when the build has no uPlot (naming the fix); check_html_path() and write_html_file()
// throw IoError naming the file and the fix.
#pragma once

#include <string>

#include <nlohmann/json.hpp>

namespace trident::dashboard {

// `tmpl` with its head marker replaced by `head` and its scripts marker by `scripts`.
std::string fill_page(const std::string& tmpl, const std::string& head, const std::string& scripts);

// `tmpl` with uPlot's and the dashboard's styles, then `window.<data_var> = data` (escaped so that no text in
// it closes the <script> element), uPlot, charts.js and `page_script`, all inlined.
std::string inline_page(const char* tmpl, const std::string& data_var, const nlohmann::json& data,
                        const char* page_script);

// The figure page (page/figures.html, page/figures.js) of `spec`, inlined: see figures.js for its shape
// ({title, subtitle, notes, figures: [line or bars], tables}).
std::string render_figures(const nlohmann::json& spec);

// Refuses, before a long run, a path `flag` names whose file could not be written: a folder, or a file in
// a folder that does not exist or is not writable.
void check_html_path(const std::string& path, const std::string& flag);

// Writes `html` to `path` (replacing it); `who` leads the error message ("bench comm --html").
void write_html_file(const std::string& path, const std::string& html, const std::string& who);

}  // namespace trident::dashboard
