// JSON Schema to grammar: the output is a JSON value (compact: no whitespace, unless
// whitespace is flexible) that validates against the schema. docs/api.md lists the keywords.
//
// Policies (each documented in docs/api.md):
//  - Properties are written in the order the schema lists them; required ones always, optional
//    ones may be left out. additionalProperties absent means none (a valid choice: the output
//    still validates); true or a schema allows extra "key": value pairs after the listed ones.
//  - anyOf and oneOf are alternatives (oneOf's branches are assumed disjoint, as they are in
//    the schemas people write); allOf is merged when its parts are objects or agree.
//  - Keywords that would constrain the value but are not enforced (not, if/then/else,
//    patternProperties, uniqueItems: true, multipleOf, bounds on non-integer numbers...) are
//    an error naming the keyword and its JSON pointer; never silently ignored. Annotations
//    (title, description, default, examples, $comment...) and formats this compiler does not
//    know (format is an annotation by default since draft 2019-09) are ignored.
#pragma once

#include <string_view>

#include "kiln/grammar/grammar.h"
#include "kiln/util/status.h"

namespace kiln::grammar {

struct JsonSchemaOptions {
  // false: up to 16 whitespace characters around structural characters (a model trained on
  // pretty-printed JSON may want them); true: none (the default: fewer tokens, same value).
  bool compact = true;
};

// schema_text: the schema as JSON text. Errors say what and where ("#/properties/a").
Expected<Grammar> compile_json_schema(std::string_view schema_text,
                                      const JsonSchemaOptions& options = {});

// Any JSON object (response_format json_object).
Grammar json_object_grammar(const JsonSchemaOptions& options = {});

}  // namespace kiln::grammar
