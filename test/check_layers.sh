#!/usr/bin/env bash
# Keeps the arrows between the rooms of the library (ARCHITECTURE.md): each room
# includes only rooms below it, the CUDA headers appear only in gpu/, and the
# rooms below the modules never call the modules' public functions (every file
# sees the whole public API through core.h, so an include check alone would
# miss a call from tape/ into lib/variable). Prints each offence as
# "file:line: what" and exits 1 if there is one.
#   check_layers.sh [SOURCE_ROOT]
set -u
cd "${1:-$(dirname "$0")/..}" || exit 2

# The room a repository path belongs to.
room_of() {
    case "$1" in
        lib/backends.c) echo top ;; # the build's list of backends
        lib/core/*) echo lib/core ;;
        lib/variable/*) echo lib/variable ;;
        lib/optim/*) echo lib/optim ;;
        lib/graph/*) echo lib/graph ;;
        lib/layers/*) echo lib/layers ;;
        lib/data/*) echo lib/data ;;
        lib/checkpoint/*) echo lib/checkpoint ;;
        lib/distribute/*) echo lib/distribute ;;
        ops/*) echo ops ;; # ops/cpu is part of ops
        tape/*) echo tape ;;
        gpu/*) echo gpu ;;
        *) echo other ;;
    esac
}

# The rooms each room may include besides itself.
allowed() {
    case "$1" in
        lib/core) echo "" ;;
        gpu) echo "lib/core" ;;
        tape) echo "lib/core" ;;
        ops) echo "lib/core" ;;
        lib/variable|lib/data|lib/graph) echo "lib/core ops tape" ;;
        lib/optim|lib/layers) echo "lib/core ops tape lib/variable" ;;
        lib/distribute) echo "lib/core ops tape lib/variable lib/optim" ;;
        lib/checkpoint) echo "lib/core ops tape lib/variable lib/optim lib/data" ;;
        top) echo "lib/core gpu ops tape" ;;
    esac
}

fail=0
offend() { echo "$1"; fail=1; }

files=$(find lib ops tape gpu -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
[ -n "$files" ] || { echo "no sources found under $(pwd)"; exit 2; }

for f in $files; do
    from=$(room_of "$f")
    while IFS=: read -r line text; do
        inc=$(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' <<<"$text")
        [ -n "$inc" ] || continue
        [ "$inc" = nb_config.h ] && continue # generated into the build folder
        # Quoted includes resolve beside the file first, then from the root.
        path="$inc"
        [ -f "$(dirname "$f")/$inc" ] && path="$(dirname "$f")/$inc"
        path=$(realpath -m --relative-to=. "$path")
        to=$(room_of "$path")
        [ "$to" = "$from" ] && continue
        ok=0
        for a in $(allowed "$from"); do [ "$a" = "$to" ] && ok=1; done
        [ $ok = 1 ] || offend "$f:$line: $from includes \"$inc\" ($to is not below it)"
    done < <(grep -n '#[[:space:]]*include' "$f")
done

# CUDA, cuBLAS, cuDNN, cuRAND, CUB and NCCL headers: gpu/ only.
while IFS= read -r hit; do
    offend "$hit: a CUDA header outside gpu/"
done < <(grep -nE '#[[:space:]]*include[[:space:]]*<(cuda|cublas|cudnn|curand|cub/|nccl)' -r lib ops tape)

# The core names no backend: backends register through lib/backends.c.
while IFS= read -r hit; do
    offend "$hit: lib/core names a backend"
done < <(grep -nE '\bnb__(cpu|gpu)_[a-z_]+' -r lib/core)

# Calls from lib/core, ops and gpu up into the tape's public functions: ops
# record through lib/core/record.h only.
while IFS= read -r hit; do
    offend "$hit: calls the tape"
done < <(grep -nE '\b(nb_tape_[a-z_]+|nb_custom_gradient|nb_gradient_check[a-z_]*)[[:space:]]*\(' -r lib/core ops gpu)

# Calls from lib/core, ops, tape, gpu and lib/graph up into lib/variable,
# lib/optim, lib/data and lib/distribute (a graph reaches variables and
# optimizers only through the hooks they register in lib/core/capture.h).
modules='\b(nb_read|nb_variable_[a-z_]+|nb__variable_[a-z_]+|nb_optimizer_[a-z_]+|nb__optimizer_[a-z_]+|nb_(sgd|adam)[a-z_]*_new|nb_mirrored_[a-z_]+|nb_idx_[a-z_]+)[[:space:]]*\('
while IFS= read -r hit; do
    offend "$hit: calls a module above it"
done < <(grep -nE "$modules" -r lib/core ops tape gpu lib/graph)

exit $fail
