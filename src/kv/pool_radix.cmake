# oscar_kv_pool: page pools, CSR page tables, the radix prefix cache and admission arithmetic.
# Included from src/kv/CMakeLists.txt (and, guarded, from tests/kv_pool/CMakeLists.txt so the
# tests build before that include lands). Paths are relative to this file, so it works from both.
add_library(oscar_kv_pool
  ${CMAKE_CURRENT_LIST_DIR}/page_pool.cpp
  ${CMAKE_CURRENT_LIST_DIR}/radix_cache.cpp
  ${CMAKE_CURRENT_LIST_DIR}/page_table.cpp
  ${CMAKE_CURRENT_LIST_DIR}/admission.cpp
)
target_link_libraries(oscar_kv_pool PUBLIC oscar_core)
oscar_strict_warnings(oscar_kv_pool)
