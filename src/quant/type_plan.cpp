#include "quant/type_plan.h"

#include <nlohmann/json.hpp>

#include "core/file_io.h"
#include "quant/quant.h"

namespace substrate {

Expected<std::map<std::string, DType>> ParseTensorTypePlan(std::string_view text) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text.begin(), text.end());
  } catch (const nlohmann::json::exception& e) {
    return InvalidArgument(std::string("plan: not valid JSON: ") + e.what());
  }
  const nlohmann::json* table = &j;
  if (j.is_object() && j.contains("tensor_types")) table = &j["tensor_types"];
  if (!table->is_object())
    return InvalidArgument("plan: expected an object of tensor name -> type name");
  std::map<std::string, DType> out;
  for (auto it = table->begin(); it != table->end(); ++it) {
    if (!it.value().is_string())
      return InvalidArgument("plan: type of tensor '" + it.key() + "' is not a string");
    const std::string name = it.value().get<std::string>();
    auto type = DTypeFromName(name);
    if (!type)
      return InvalidArgument("plan: tensor '" + it.key() + "': unknown type '" + name + "'");
    if (!CanQuantize(*type))
      return Unimplemented("plan: tensor '" + it.key() + "': cannot quantize to " + name);
    out[it.key()] = *type;
  }
  return out;
}

Expected<std::map<std::string, DType>> LoadTensorTypePlan(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, ReadFileToString(path, 256ull << 20));
  auto plan = ParseTensorTypePlan(text);
  if (!plan.ok()) return plan.status().WithContext(path);
  return plan;
}

}  // namespace substrate
