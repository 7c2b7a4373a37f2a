// Config files: Config::load of an INI file; an accepted config writes an INI (to_ini) that reads
// back to the same resolved settings.
#include "tasks/config.h"
#include "tests/fuzz/fuzz.h"

TL_FUZZ_TARGET(config) {
  const std::string path = tl::fuzz::write_file("config.ini", data, size);
  const tl::Config c = tl::Config::load(path);
  const std::string ini = c.to_ini();
  const tl::Config again = tl::Config::load(tl::fuzz::write_file("again.ini", ini));
  TL_FUZZ_CHECK(again.resolved() == c.resolved(), "to_ini() did not read back to the same config:\n" + ini);
}
