#include "compression/registry.h"

#include <c10/util/Exception.h>

#include <memory>
#include <mutex>

#include "compression/payload.h"
#include "compression/spec.h"

namespace tl {

// Called once, on first use of the registry: the stateless codecs (compression/codecs/register.cpp)
// and the stateful and learned ones (compression/stateful/register.cpp).
void register_basic_codecs();
void register_stateful_codecs();

namespace {

// Records by name, and the wire ids that index them. A record is only ever completed (a factory
// for a wire-id-only record, a wire id for a spec name without one), never changed or removed, so
// the pointers handed out stay valid.
struct Registry {
  std::mutex mutex;
  std::map<std::string, std::unique_ptr<CodecRecord>> by_name;
  std::map<uint16_t, const CodecRecord*> by_id;
};
Registry& registry() {
  static Registry r;
  return r;
}

// With the lock held.
void check_id_free(const Registry& r, uint16_t id, const char* who) {
  auto i = r.by_id.find(id);
  TORCH_CHECK(i == r.by_id.end(), who, ": id ", id, " is taken by '", i->second->name, "'");
}

}  // namespace

namespace {

// Set while this thread registers the built-in codecs (ensure_builtin_codecs).
thread_local bool registering_builtins = false;

// Every registration from outside first makes sure the built-in codecs are in, so that a name or
// wire id a built-in holds is refused whichever registers first (a test binary or a lab may
// register before any lookup has run).
void builtins_first() {
  if (!registering_builtins) ensure_builtin_codecs();
}

}  // namespace

void ensure_builtin_codecs() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct Flag {
      Flag() { registering_builtins = true; }
      ~Flag() { registering_builtins = false; }
    } flag;
    register_basic_codecs();
    register_stateful_codecs();
  });
}

void register_codec(CodecRecord record) {
  builtins_first();
  const std::string name = record.name;
  if (record.factory)
    TORCH_CHECK(is_spec_name(name), "register_codec: '", name,
                "' is not a valid name (a letter or '_', then letters, digits, '_', '-', '.')");
  TORCH_CHECK(!name.empty(), "register_codec: a record needs a name");
  TORCH_CHECK(record.factory || record.wire_id != 0, "register_codec: '", name,
              "' has neither a factory nor a wire id");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  if (it != r.by_name.end()) {
    CodecRecord& old = *it->second;
    // Only a wire-id-only record (register_codec_id) takes a factory afterwards.
    TORCH_CHECK(!old.factory && record.factory, "register_codec: '", name, "' is already registered");
    TORCH_CHECK(record.wire_id == 0 || record.wire_id == old.wire_id, "register_codec: '", name, "' already has id ",
                old.wire_id);
    record.wire_id = old.wire_id;
    old = std::move(record);
    return;
  }
  if (record.wire_id != 0) check_id_free(r, record.wire_id, "register_codec");
  auto rec = std::make_unique<CodecRecord>(std::move(record));
  if (rec->wire_id != 0) r.by_id[rec->wire_id] = rec.get();
  r.by_name[name] = std::move(rec);
}

void register_compressor(const std::string& name, CompressorFactory factory, const std::string& help,
                         uint16_t wire_id) {
  TORCH_CHECK(factory, "register_compressor: no factory for '", name, "'");
  CodecRecord rec;
  rec.name = name;
  rec.wire_id = wire_id;
  rec.factory = std::move(factory);
  rec.help = help;
  register_codec(std::move(rec));
}

void register_codec_id(const std::string& name, uint16_t id) {
  builtins_first();
  TORCH_CHECK(id != 0, "register_codec_id: '", name, "': id 0 means 'none'; give a fixed id >= 1");
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  if (it != r.by_name.end() && it->second->wire_id == id) return;
  TORCH_CHECK(it == r.by_name.end() || it->second->wire_id == 0, "register_codec_id: '", name, "' already has id ",
              it->second->wire_id);
  check_id_free(r, id, "register_codec_id");
  if (it != r.by_name.end()) {  // a spec name without an id of its own gets one
    it->second->wire_id = id;
    r.by_id[id] = it->second.get();
    return;
  }
  auto rec = std::make_unique<CodecRecord>();
  rec->name = name;
  rec->wire_id = id;
  r.by_id[id] = rec.get();
  r.by_name[name] = std::move(rec);
}

const CodecRecord* find_codec(const std::string& name) {
  ensure_builtin_codecs();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  return it == r.by_name.end() ? nullptr : it->second.get();
}

const CodecRecord* find_codec(uint16_t wire_id) {
  ensure_builtin_codecs();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_id.find(wire_id);
  return it == r.by_id.end() ? nullptr : it->second;
}

std::vector<const CodecRecord*> codec_records() {
  ensure_builtin_codecs();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  std::vector<const CodecRecord*> out;
  for (const auto& [_, rec] : r.by_name) out.push_back(rec.get());
  return out;
}

std::string codec_names(const std::function<bool(const CodecRecord&)>& pred) {
  std::string s;
  for (const CodecRecord* rec : codec_records())
    if (rec->factory && pred(*rec)) s += (s.empty() ? "" : ", ") + rec->name;
  return s;
}

std::map<std::string, std::string> known_compressors() {
  std::map<std::string, std::string> out;
  for (const CodecRecord* rec : codec_records())
    if (rec->factory) out[rec->name] = rec->help;
  return out;
}

// ---- payload.h's codec ids: the records' wire ids ---------------------------------------------------
uint16_t codec_id(const std::string& name) {
  ensure_builtin_codecs();
  auto& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  auto it = r.by_name.find(name);
  if (it != r.by_name.end() && it->second->wire_id != 0) return it->second->wire_id;
  std::string known;
  for (const auto& [n, rec] : r.by_name)
    if (rec->wire_id != 0) known += (known.empty() ? "" : ", ") + n;
  TORCH_CHECK(false, "no codec id for '", name, "'; known: ", known, " (add one with register_codec_id)");
}

const std::string& codec_name(uint16_t id) {
  const CodecRecord* rec = find_codec(id);
  TORCH_CHECK(rec, "unknown codec id ", id, " in payload (corrupt, or written by a build with codecs",
              " this one lacks)");
  return rec->name;
}

}  // namespace tl
