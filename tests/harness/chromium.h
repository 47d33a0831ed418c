// Headless Chromium for the tests that check a page in a real browser (Debian's chromium, scripts/deps.sh):
// find it on PATH and read the DOM a page leaves after its scripts ran (--dump-dom).
#pragma once

#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "unit/launch/process_runner.h"

namespace trident::testing {

// The browser's path, or "" when none is on PATH.
inline std::string find_chromium() {
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin");
  for (std::string d; std::getline(dirs, d, ':');)
    for (const char* name : {"chromium", "chromium-browser", "google-chrome"})
      if (::access((std::filesystem::path(d) / name).c_str(), X_OK) == 0) return (std::filesystem::path(d) / name).string();
  return "";
}

// The DOM of `url` after the page's scripts ran for `budget_ms` of virtual time, or with `live` of real
// time: an open event stream is a fetch that never ends, and virtual time waits for pending fetches. An
// uncaught exception on the page fails the test.
inline std::string dump_dom(const std::string& chromium, const std::string& url, const std::filesystem::path& profile,
                            int budget_ms = 4000, bool live = false) {
  ProcessRunner p({chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                   "--no-first-run", "--disable-extensions", "--user-data-dir=" + profile.string(),
                   "--enable-logging=stderr", "--v=0",  // the page's console (an uncaught exception) on stderr
                   (live ? "--timeout=" : "--virtual-time-budget=") + std::to_string(budget_ms),
                   "--window-size=1400,2000", "--dump-dom", url},
                  make_env({}, {}));
  p.wait(60);  // to its exit (the guard kills a browser that hangs)
  for (size_t at = p.err().find("Uncaught"); at != std::string::npos; at = p.err().find("Uncaught", at + 1))
    ADD_FAILURE() << "the page threw at " << url << ": " << p.err().substr(at, p.err().find('\n', at) - at);
  return p.out();
}

}  // namespace trident::testing
