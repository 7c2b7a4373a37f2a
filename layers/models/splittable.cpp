#include "layers/models/splittable.h"

#include <sstream>

namespace tl {

namespace {
std::string join_list(const std::vector<std::string>& names) {
  std::string s;
  for (const auto& n : names) s += (s.empty() ? "" : ", ") + n;
  return s.empty() ? "none" : s;
}
}  // namespace

void Stage::add_at_path(const std::string& path, const ModulePtr& module) {
  // Walk (creating plain containers) down to the parent of the leaf, then register the leaf.
  Module* parent = this;
  std::istringstream is(path);
  std::vector<std::string> parts;
  for (std::string p; std::getline(is, p, '.');) parts.push_back(p);
  TORCH_CHECK(!parts.empty(), "Stage: empty module path");
  for (size_t i = 0; i + 1 < parts.size(); ++i) {
    ModulePtr next;
    for (const auto& [n, c] : parent->named_children())
      if (n == parts[i]) next = c;
    if (!next) next = parent->register_module(parts[i], std::make_shared<Module>("ModuleList"));
    parent = next.get();
  }
  for (const auto& [n, c] : parent->named_children()) {
    if (n == parts.back()) {
      TORCH_CHECK(c == module, "Stage: two different modules under the path '", path, "'");
      return;  // shared by two segments of this stage (tied weights): registered once
    }
  }
  parent->register_module(parts.back(), module);
}

void Stage::add(const Segment& segment) {
  for (const auto& [path, m] : segment.modules) add_at_path(path, m);
  fns_.push_back(segment.fn);
  names_.push_back(segment.end.empty() ? "output" : segment.end);
}

StageInputs StageInputs::slice(int64_t start, int64_t size) const {
  auto rows = [&](const at::Tensor& t) { return t.defined() ? t.narrow(0, start, size) : t; };
  return {rows(token_ids), rows(attention_mask), rows(token_type_ids)};
}

StageInputs StageInputs::to(at::Device device) const {
  auto move = [&](const at::Tensor& t) { return t.defined() ? t.to(device) : t; };
  return {move(token_ids), move(attention_mask), move(token_type_ids)};
}

Variable Stage::forward(const Variable& x, const StageInputs& inputs) {
  Variable y = x;
  for (auto& fn : fns_) y = fn(y, inputs);
  return y;
}

std::vector<std::string> segment_cut_points(const std::vector<Segment>& segments) {
  std::vector<std::string> out;
  for (size_t i = 0; i + 1 < segments.size(); ++i) out.push_back(segments[i].end);
  return out;
}

namespace {
// Position of every cut among the valid cut points: known, and strictly increasing in model order.
std::vector<size_t> cut_positions(const std::string& model, const std::vector<std::string>& valid,
                                  const std::vector<std::string>& cuts) {
  std::vector<size_t> at;
  for (const auto& cut : cuts) {
    size_t i = 0;
    while (i < valid.size() && valid[i] != cut) ++i;
    TORCH_CHECK(i < valid.size(), model, ": unknown cut point '", cut,
                "'; valid cut points, in order: ", join_list(valid));
    TORCH_CHECK(at.empty() || i > at.back(), model, ": cut point '", cut, "' ",
                i == at.back() ? "is given twice" : "comes before the previous cut '" + valid[at.back()] + "'",
                "; cuts must be distinct and in model order: ", join_list(valid));
    at.push_back(i);
  }
  return at;
}
}  // namespace

std::vector<bool> StageSelection::built(const std::string& model, const std::vector<std::string>& segment_ends) const {
  std::vector<bool> out(segment_ends.size(), true);
  if (!stages) return out;
  const std::vector<std::string> valid(segment_ends.begin(), segment_ends.end() - (segment_ends.empty() ? 0 : 1));
  const std::vector<size_t> at = cut_positions(model, valid, cuts);
  for (int64_t s : *stages)
    TORCH_CHECK(s >= 0 && s <= static_cast<int64_t>(cuts.size()), model, ": stage ", s, " does not exist; ",
                cuts.size(), " cuts make stages 0 .. ", cuts.size());
  int64_t stage = 0;
  size_t next_cut = 0;
  for (size_t i = 0; i < segment_ends.size(); ++i) {
    out[i] = stages->count(stage) > 0;
    if (next_cut < at.size() && at[next_cut] == i) ++stage, ++next_cut;
  }
  return out;
}

void check_segment_built(bool built, const std::string& model, const std::string& end) {
  TORCH_CHECK(built, model, ": segment '", end.empty() ? "output" : end,
              "' was not built in this process (Note [building only some stages]); the rank that holds its stage "
              "runs it");
}

Segment unbuilt_segment(const std::string& model, const std::string& end) {
  return {end, {}, [model, end](const Variable&, const StageInputs&) -> Variable {
            check_segment_built(false, model, end);
            return {};
          }};
}

Segment segment_if_built(bool built, const std::string& model, const std::string& end,
                         std::vector<std::pair<std::string, ModulePtr>> modules, SegmentFn fn) {
  return built ? Segment{end, std::move(modules), std::move(fn)} : unbuilt_segment(model, end);
}

std::vector<ModulePtr> split_segments(const std::string& model, const std::vector<Segment>& segments,
                                      const std::vector<std::string>& cuts) {
  const std::vector<size_t> at = cut_positions(model, segment_cut_points(segments), cuts);
  std::vector<ModulePtr> stages;
  auto stage = std::make_shared<Stage>();
  size_t next_cut = 0;
  for (size_t i = 0; i < segments.size(); ++i) {
    stage->add(segments[i]);
    if (next_cut < at.size() && at[next_cut] == i) {
      stages.push_back(stage);
      stage = std::make_shared<Stage>();
      ++next_cut;
    }
  }
  stages.push_back(stage);
  return stages;
}

Variable run_segments(const std::vector<Segment>& segments, const Variable& x, const StageInputs& inputs) {
  Variable y = x;
  for (const auto& s : segments) y = s.fn(y, inputs);
  return y;
}

}  // namespace tl
