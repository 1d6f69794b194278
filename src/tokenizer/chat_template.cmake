# oscar_chat_template: the sandboxed Jinja2-subset interpreter behind ChatTemplate
# (chat_template.h, jinja_*.cpp). Included from src/tokenizer/CMakeLists.txt after
# oscar_tokenizer is defined (and, as a fallback, from tests/chat_template/); safe to include
# more than once. Because oscar_tokenizer may list chat_template.cpp among its own sources, it is
# linked to this library so that the interpreter's symbols always resolve.
if(NOT TARGET oscar_chat_template)
  set(_oscar_ct_dir ${CMAKE_CURRENT_LIST_DIR})
  add_library(oscar_chat_template
    ${_oscar_ct_dir}/chat_template.cpp
    ${_oscar_ct_dir}/jinja_builtins.cpp
    ${_oscar_ct_dir}/jinja_eval.cpp
    ${_oscar_ct_dir}/jinja_lexer.cpp
    ${_oscar_ct_dir}/jinja_parser.cpp
    ${_oscar_ct_dir}/jinja_value.cpp
  )
  target_link_libraries(oscar_chat_template
    PUBLIC oscar_core nlohmann_json::nlohmann_json
    PRIVATE PkgConfig::UTF8PROC)
  oscar_strict_warnings(oscar_chat_template)
  if(TARGET oscar_tokenizer)
    target_link_libraries(oscar_tokenizer PUBLIC oscar_chat_template)
  endif()
endif()
