#include "trident/dashboard/page_file.h"

#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <fstream>
#include <string_view>

#include "trident/core/error.h"
#include "trident/dashboard/assets.h"

namespace trident::dashboard {

namespace {

// JSON safe inside a <script> element: "</" written as "<\/" (the same string to a JSON parser).
std::string script_json(const nlohmann::json& j) {
  std::string s = j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::string out;
  out.reserve(s.size());
  for (size_t i = 0; i < s.size(); ++i) {
    out += s[i];
    if (s[i] == '<' && i + 1 < s.size() && s[i + 1] == '/') out += '\\';
  }
  return out;
}

std::string replace_marker(std::string page, std::string_view marker, const std::string& with) {
  const size_t at = page.find(marker);
  if (at != std::string::npos) page.replace(at, marker.size(), with);
  return page;
}

}  // namespace

std::string fill_page(const std::string& tmpl, const std::string& head, const std::string& scripts) {
  return replace_marker(replace_marker(tmpl, "<!--trident:head-->", head), "<!--trident:scripts-->", scripts);
}

std::string inline_page(const char* tmpl, const std::string& data_var, const nlohmann::json& data,
                        const char* page_script) {
  if (!assets::kHaveUplot)
    TRIDENT_THROW(InvalidArgument, "this trident was built without uPlot, which the page draws its charts with: run "
                                   "scripts/deps.sh build (npm's uplot), re-run cmake and rebuild");
  return fill_page(tmpl,
                   std::string("<style>\n") + assets::kUplotCss + "\n</style>\n<style>\n" + assets::kDashboardCss +
                       "\n</style>",
                   "<script>window." + data_var + " = " + script_json(data) + ";</script>\n<script>\n" +
                       assets::kUplotJs + "\n</script>\n<script>\n" + assets::kChartsJs + "\n</script>\n<script>\n" +
                       page_script + "\n</script>");
}

std::string render_figures(const nlohmann::json& spec) {
  return inline_page(assets::kFiguresHtml, "TRIDENT_FIGURES", spec, assets::kFiguresJs);
}

void check_html_path(const std::string& path, const std::string& flag) {
  namespace fs = std::filesystem;
  if (path.empty()) TRIDENT_THROW(IoError, "{}: give the HTML file to write (e.g. {} out/page.html)", flag, flag);
  std::error_code ec;
  if (fs::is_directory(path, ec))
    TRIDENT_THROW(IoError, "{} '{}' is a folder: give a file name in it (e.g. {}/page.html)", flag, path, path);
  fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) parent = ".";
  if (!fs::is_directory(parent, ec))
    TRIDENT_THROW(IoError, "{}: cannot write '{}': '{}' {}; create the folder or pick another path", flag, path,
                  parent.string(), fs::exists(parent, ec) ? "is a file, not a folder" : "does not exist");
  if (::access(parent.c_str(), W_OK) != 0 || (fs::exists(path, ec) && ::access(path.c_str(), W_OK) != 0))
    TRIDENT_THROW(IoError, "{}: cannot write '{}': {}; pick a writable path", flag, path,
                  detail::errno_string(errno));
}

void write_html_file(const std::string& path, const std::string& html, const std::string& who) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  const int open_errno = errno;
  if (!out)
    TRIDENT_THROW(IoError, "{}: cannot write '{}': {}; check the folder exists and is writable", who, path,
                  detail::errno_string(open_errno));
  out << html;
  out.close();
  if (!out)
    TRIDENT_THROW(IoError, "{}: cannot write '{}' (disk full?); check the folder exists and is writable", who, path);
}

}  // namespace trident::dashboard
