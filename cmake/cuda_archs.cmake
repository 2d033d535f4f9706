# vela_detect_cuda_archs(OUT): the compute capabilities of the GPUs that
# nvidia-smi lists ("9.0" -> "90"), each once, in order, those below 8.0 left
# out with a warning; "90" where there is no nvidia-smi, no GPU of 8.0 or
# newer, or an answer that is not a capability (an old driver without
# --query-gpu=compute_cap).
function(vela_detect_cuda_archs out)
  set(archs "")
  find_program(VELA_NVIDIA_SMI nvidia-smi)
  if(VELA_NVIDIA_SMI)
    execute_process(COMMAND ${VELA_NVIDIA_SMI} --query-gpu=compute_cap --format=csv,noheader
                    OUTPUT_VARIABLE caps RESULT_VARIABLE rc ERROR_QUIET TIMEOUT 30)
    if(rc EQUAL 0)
      string(REPLACE "\n" ";" caps "${caps}")
      foreach(cap IN LISTS caps)
        string(STRIP "${cap}" cap)
        if(cap STREQUAL "")
          continue()
        endif()
        if(NOT cap MATCHES "^([0-9]+)\\.([0-9]+)$")
          set(archs "")
          break()
        endif()
        if(CMAKE_MATCH_1 LESS 8)
          # cp.async and bf16 tensor cores: Ampere and newer only.
          message(WARNING "vela: a GPU of compute capability ${cap} is below 8.0, which "
                          "vela's kernels need; no code is built for it")
          continue()
        endif()
        list(APPEND archs "${CMAKE_MATCH_1}${CMAKE_MATCH_2}")
      endforeach()
      list(REMOVE_DUPLICATES archs)
    endif()
  endif()
  if(archs STREQUAL "")
    set(archs "90")
    message(STATUS "vela: no GPU seen (nvidia-smi): CUDA kernels for sm_90 only")
  else()
    message(STATUS "vela: CUDA kernels for this machine's GPUs: ${archs}")
  endif()
  set(${out} "${archs}" PARENT_SCOPE)
endfunction()
