# Installs the built glossa into a scratch prefix, then configures, builds and runs the consumer
# project against it with find_package(glossa CONFIG).
foreach(var GLOSSA_BINARY_DIR CONSUMER_SOURCE_DIR WORK_DIR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "${var} is not set")
  endif()
endforeach()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/install")

function(run)
  execute_process(COMMAND ${ARGV} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "command failed (${rc}): ${ARGV}\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}" PARENT_SCOPE)
endfunction()

run("${CMAKE_COMMAND}" --install "${GLOSSA_BINARY_DIR}" --prefix "${prefix}")
if(NOT EXISTS "${prefix}/lib/cmake/glossa/glossaConfig.cmake")
  message(FATAL_ERROR "the install has no lib/cmake/glossa/glossaConfig.cmake")
endif()
set(launcher "")
find_program(CCACHE_PROGRAM ccache)
if(CCACHE_PROGRAM)
  set(launcher "-DCMAKE_CXX_COMPILER_LAUNCHER=${CCACHE_PROGRAM}")
endif()
run("${CMAKE_COMMAND}" -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build"
    "-DCMAKE_PREFIX_PATH=${prefix}" -DCMAKE_BUILD_TYPE=Release ${launcher})
run("${CMAKE_COMMAND}" --build "${WORK_DIR}/build")
run("${WORK_DIR}/build/consumer")
message(STATUS "consumer output: ${LAST_OUTPUT}")

# The installed program needs nothing from the source or build tree: move the installation
# elsewhere and train the default model from it; its data must come from the moved share/glossa.
set(moved "${WORK_DIR}/moved")
file(RENAME "${prefix}" "${moved}")
if(NOT EXISTS "${moved}/share/glossa/austen/train.txt")
  message(FATAL_ERROR "the install has no share/glossa/austen/train.txt")
endif()
run("${moved}/bin/glossa" inspect_model --model=lm.austen.TransformerLmTiny)
string(FIND "${LAST_OUTPUT}" "text:${moved}/share/glossa/austen/train.txt" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the installed glossa does not read its installed data:\n${LAST_OUTPUT}")
endif()
set(small "task.emb.embedding_dim : 16; task.position_emb.embedding_dim : 16; task.softmax.input_dim : 16; task.stack.num_layers : 1; task.stack.mdl_dim : 16; task.stack.hidden_dim : 32; task.stack.num_atten_heads : 2; task.train.steps_per_loop : 2")
execute_process(COMMAND "${moved}/bin/glossa" train --model=lm.austen.TransformerLmTiny
                        "--logdir=${WORK_DIR}/logdir" --max_steps=2 "--model_params_override=${small}"
                WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                ERROR_VARIABLE err)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK_DIR}/logdir/train/ckpt-00000002.safetensors")
  message(FATAL_ERROR "glossa train from the moved installation failed (${rc}):\n${out}\n${err}")
endif()
message(STATUS "trained 2 steps from the moved installation")

# A model library of one's own (docs/examples/lm_library_example.cc, a task derived from the LM task) is
# trained, evaluated, reported, exported and served by the installed glossa with --load_library
# (or GLOSSA_LIBRARIES), reading the installed Austen text through `datasets.*`.
set(lib "${WORK_DIR}/build/libconsumer_model.so")
set(austen "${moved}/share/glossa/austen")
# (A params file: ';' would split a CMake argument.)
file(WRITE "${WORK_DIR}/mylm.params" "datasets.train : 'text:${austen}/train.txt'
datasets.dev : 'text:${austen}/dev.txt'
task.input.tokenizer.spm_model_file : '${austen}/spm_2k.model'
task.train.steps_per_loop : 2
")
function(glossa_step what)
  execute_process(COMMAND ${ARGN} WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}):\n${out}\n${err}")
  endif()
  set(LAST_OUTPUT "${out}${err}" PARENT_SCOPE)
endfunction()
glossa_step("list_models --load_library" "${moved}/bin/glossa" list_models "--load_library=${lib}")
string(FIND "${LAST_OUTPUT}" "consumer.lm.MyLm" at)
if(at EQUAL -1)
  message(FATAL_ERROR "list_models --load_library does not list consumer.lm.MyLm:\n${LAST_OUTPUT}")
endif()
glossa_step("train of the library's model" "${moved}/bin/glossa" train --model=consumer.lm.MyLm
            "--load_library=${lib}" "--logdir=${WORK_DIR}/mylm" --max_steps=4
            "--model_params_file_override=${WORK_DIR}/mylm.params")
glossa_step("eval of the library's model (GLOSSA_LIBRARIES)" "${CMAKE_COMMAND}" -E env
            "GLOSSA_LIBRARIES=${lib}" "${moved}/bin/glossa" eval --model=consumer.lm.MyLm
            "--logdir=${WORK_DIR}/mylm" --dataset=Dev --once
            "--model_params_override=task.eval.samples_per_summary : 32")
file(READ "${WORK_DIR}/mylm/eval_dev/score-00000004.txt" score)
foreach(metric log_pplx unk_fraction)
  string(FIND "${score}" "${metric}: " at)
  if(at EQUAL -1)
    message(FATAL_ERROR "the library's task lost ${metric}: ${score}")
  endif()
endforeach()
glossa_step("decode of the library's model" "${moved}/bin/glossa" decode --model=consumer.lm.MyLm
            "--load_library=${lib}" "--logdir=${WORK_DIR}/mylm" --dataset=Dev --once
            "--model_params_override=task.eval.decoder_samples_per_summary : 4")
glossa_step("report of the library's model" "${moved}/bin/glossa" report --model=consumer.lm.MyLm
            "--load_library=${lib}" "--logdir=${WORK_DIR}/mylm" --num_samples=1)
string(FIND "${LAST_OUTPUT}" "unigram log_pplx:" at)
if(at EQUAL -1)
  message(FATAL_ERROR "the library's report lost the unigram baseline:\n${LAST_OUTPUT}")
endif()
glossa_step("export of the library's model" "${moved}/bin/glossa" export --model=consumer.lm.MyLm
            "--load_library=${lib}" "--logdir=${WORK_DIR}/mylm" "--out=${WORK_DIR}/mylm_bundle")
file(WRITE "${WORK_DIR}/lines.txt" "It is a truth universally acknowledged\n")
glossa_step("predict with the library's bundle" "${moved}/bin/glossa" predict "--load_library=${lib}"
            "--bundle=${WORK_DIR}/mylm_bundle" "--input=${WORK_DIR}/lines.txt")
string(FIND "${LAST_OUTPUT}" "total_log_prob" at)
if(at EQUAL -1)
  message(FATAL_ERROR "predict with the library's bundle printed no score:\n${LAST_OUTPUT}")
endif()
message(STATUS "a model library trained, evaluated, decoded, reported, exported and served")

# The installed Python package: import it from the moved installation, and train a Python model
# configuration through the installed program (which re-runs itself as python3 -m glossa).
if(GLOSSA_PYTHON)
  set(site "${moved}/lib/python3/dist-packages")
  file(WRITE "${WORK_DIR}/consumer_model.py" "
import glossa

class Small:
    def Task(self):
        return glossa.model_registry.get_params('lm.austen.TransformerLmTiny', 'Train', '${small}').task

    def Train(self):
        return glossa.model_registry.get_params('lm.austen.TransformerLmTiny', 'Train').task.input
")
  execute_process(COMMAND "${CMAKE_COMMAND}" -E env "PYTHONPATH=${site}"
                          /usr/bin/python3 -c "import glossa; print(glossa.__file__, glossa.model_registry.get_params('lm.austen.TransformerLmTiny').task.input.file_pattern)"
                  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  string(FIND "${out}" "${site}/glossa/__init__.py text:${moved}/share/glossa/austen/train.txt" at)
  if(NOT rc EQUAL 0 OR at EQUAL -1)
    message(FATAL_ERROR "import glossa from the moved installation failed (${rc}):\n${out}\n${err}")
  endif()
  execute_process(COMMAND "${moved}/bin/glossa" train --model=py:consumer_model.Small
                          "--logdir=${WORK_DIR}/pylogdir" --max_steps=2
                  WORKING_DIRECTORY "${WORK_DIR}" RESULT_VARIABLE rc OUTPUT_VARIABLE out
                  ERROR_VARIABLE err)
  if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK_DIR}/pylogdir/train/ckpt-00000002.safetensors")
    message(FATAL_ERROR "glossa train --model=py: from the moved installation failed (${rc}):\n${out}\n${err}")
  endif()
  message(STATUS "trained a Python model configuration from the moved installation")
endif()
