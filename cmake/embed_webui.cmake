# Writes OUT, a C file holding the chat page's files (tools/serve/webui/:
# index.html, *.css, *.js) as byte arrays, for tools/serve/webui.c. The page
# needs no build step of its own (no npm, nothing fetched): the files are
# served as written. Each gets an ETag, the first 16 hex digits of its
# SHA-256, so a browser revalidates and a new build's page is never stale.
#
# Run by the build when a file of DIR changes (CMakeLists.txt, target
# vela_webui); OUT is rewritten only when its text changes.
#
# usage: cmake -DDIR=<tools/serve/webui> -DOUT=<file.c> -P embed_webui.cmake
file(GLOB names RELATIVE "${DIR}" "${DIR}/*.html" "${DIR}/*.css" "${DIR}/*.js")
list(SORT names)
set(arrays "")
set(table "")
set(i 0)
foreach(name IN LISTS names)
  file(READ "${DIR}/${name}" hex HEX)
  file(SHA256 "${DIR}/${name}" sha)
  string(SUBSTRING "${sha}" 0 16 etag)
  string(LENGTH "${hex}" n)
  math(EXPR n "${n} / 2")
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND arrays "static const unsigned char file${i}[] = {\n    ${bytes}0x00};\n")
  string(APPEND table "    {\"${name}\", file${i}, ${n}, \"\\\"${etag}\\\"\"},\n")
  math(EXPR i "${i} + 1")
endforeach()
set(text "// Generated from tools/serve/webui/ by cmake/embed_webui.cmake: do not edit.\n")
string(APPEND text "#include \"tools/serve/webui.h\"\n\n${arrays}\n")
string(APPEND text "const struct webui_file webui_files[] = {\n${table}};\n")
string(APPEND text "const size_t webui_n_files = ${i};\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
