#!/usr/bin/env bash
# Keeps the arrows between the rooms of the library: each room under lib/,
# ops/, tape/ and gpu/ includes and calls only what ARCHITECTURE.md's table of
# rooms says it may. The table is read from ARCHITECTURE.md itself, so the plan
# and the check cannot drift apart; a room with no row is an offence too.
#
# Includes: every quoted #include is resolved to the room it names.
# Calls: every nb_* function defined in these rooms is found in the sources
# (a non-static definition in a .c or .cu file, or one in a header), and a
# call of one from another room must go to a room the caller may call; an
# internal one (nb__*) also through a header the caller may include. Every
# file sees the whole public API (core.h includes nabla.h), so the include
# check alone would miss, say, lib/data calling nb_read. Functions that
# macros write (the elementwise ops' public wrappers) are not seen as
# defined, so calls to them are not checked.
# Also: CUDA headers only in gpu/; lib/core names no backend; the helpers every
# op shares (ops/op.c) call no op.
#
# Prints each offence as "file:line: what" and exits 1 if there is one.
#   check_layers.sh [SOURCE_ROOT]
set -u
cd "${1:-$(dirname "$0")/..}" || exit 2
plan=ARCHITECTURE.md
[ -f "$plan" ] || { echo "no $plan under $(pwd)"; exit 2; }

# The room a repository path belongs to: a folder under lib/ (lib/backends.c
# is a room of its own), ops/ (ops/cpu included), tape/, gpu/, include/nabla/.
room_of() {
    case "$1" in
        lib/*/*) local r="${1#lib/}"; echo "lib/${r%%/*}" ;;
        lib/*) echo "$1" ;;
        ops/*) echo ops ;;
        tape/*) echo tape ;;
        gpu/*) echo gpu ;;
        include/nabla/*) echo include/nabla ;;
        *) echo other ;;
    esac
}

# The table "| room | what it holds | may include | may call |" under "## The
# rooms": one line per room, "room|included rooms|called rooms", in the
# table's order (bottom to top). A cell lists rooms in backticks; a trailing
# slash is dropped.
table=$(awk -F'|' '
    /^## / { in_rooms = ($0 ~ /^## The rooms/) }
    in_rooms && /^\| *`/ {
        room = $2; gsub(/[ `]/, "", room); sub(/\/$/, "", room)
        out = room
        for (c = 4; c <= 5; c++) {
            cell = $c; list = ""
            while (match(cell, /`[^`]*`/)) {
                r = substr(cell, RSTART + 1, RLENGTH - 2); sub(/\/$/, "", r)
                list = list " " r
                cell = substr(cell, RSTART + RLENGTH)
            }
            out = out "|" list
        }
        print out
    }' "$plan")
[ -n "$table" ] || { echo "$plan: no table of rooms under '## The rooms'"; exit 2; }

declare -A may_include may_call
for row in $(tr ' ' ',' <<<"$table"); do
    IFS='|' read -r room inc call <<<"$row"
    may_include[$room]="${inc//,/ }"
    may_call[$room]="${call//,/ }"
done

fail=0
offend() { echo "$1"; fail=1; }

files=$(find lib ops tape gpu -type f \( -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' \) | sort)
[ -n "$files" ] || { echo "no sources found under $(pwd)"; exit 2; }

# Every room in the tree has a row.
for f in $files; do room_of "$f"; done | sort -u | while read -r room; do
    [ -n "${may_include[$room]+set}" ] || echo "$room: a room with no row in $plan's table of rooms"
done | grep . && fail=1

in_list() { # in_list WORD LIST...
    local w="$1" x
    shift
    for x in "$@"; do [ "$x" = "$w" ] && return 0; done
    return 1
}

# ---- includes -------------------------------------------------------------------
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
        # shellcheck disable=SC2086 # the list splits into words on purpose
        in_list "$to" ${may_include[$from]-} ||
            offend "$f:$line: $from includes \"$inc\" ($to is not a room it may include)"
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

# ---- calls ----------------------------------------------------------------------
# One awk pass over every file, comments and string literals blanked first:
# collects where each nb_* function is defined (and the rooms whose headers
# declare it), then prints each call that leaves its room as
# "file|line|function|defining room|defining file|declaring rooms".
# A definition starts in column 0 and reaches '{' before ';'; a call is an
# nb_* name and '(' on a line inside a body (indented) or a #define.
# shellcheck disable=SC2086 # $files: one word per file
calls=$(awk -v rooms_of="$(for f in $files; do echo "$f=$(room_of "$f")"; done | tr '\n' ' ')" '
    BEGIN {
        n = split(rooms_of, kv, " ")
        for (i = 1; i <= n; i++) { split(kv[i], p, "="); room[p[1]] = p[2] }
    }
    FNR == 1 { in_comment = 0; pending = "" }
    {
        # Blank comments and the insides of string and character literals.
        s = $0; out = ""
        while (s != "") {
            if (in_comment) {
                e = index(s, "*/")
                if (!e) { s = ""; break }
                s = substr(s, e + 2); in_comment = 0; out = out " "
                continue
            }
            if (!match(s, /\/\*|\/\/|"|\047/)) { out = out s; break }
            out = out substr(s, 1, RSTART - 1); tok = substr(s, RSTART, RLENGTH); s = substr(s, RSTART + RLENGTH)
            if (tok == "/*") { in_comment = 1; continue }
            if (tok == "//") { s = ""; break }
            if (match(s, tok == "\"" ? /^([^"\\]|\\.)*"/ : /^([^\047\\]|\\.)*\047/)) {
                out = out tok tok; s = substr(s, RLENGTH + 1)
            } else {
                out = out tok tok; s = ""
            }
        }
        file[++lines] = FILENAME; lineno[lines] = FNR; text[lines] = out
        header = FILENAME ~ /\.(h|cuh)$/
        # Definitions: a candidate in column 0 waits for its "{" or ";".
        if (pending == "" && out ~ /^[A-Za-z_]/ && out !~ /^(typedef|struct|enum|union)[ \t]/ &&
            (header || out !~ /^static/) && match(out, /nb_[A-Za-z0-9_]*[ \t]*\(/)) {
            pending = substr(out, RSTART, RLENGTH); sub(/[ \t]*\($/, "", pending)
            rest = substr(out, RSTART + RLENGTH)
        } else if (pending != "") {
            rest = out
        } else {
            rest = ""
        }
        if (pending != "") {
            b = index(rest, "{"); c = index(rest, ";")
            if (b && (!c || b < c)) {
                if (!(pending in def_room)) { def_room[pending] = room[FILENAME]; def_file[pending] = FILENAME }
                pending = ""
            } else if (c) {
                if (header) decl_rooms[pending] = decl_rooms[pending] " " room[FILENAME]
                pending = ""
            }
        }
    }
    END {
        for (i = 1; i <= lines; i++) {
            t = text[i]
            if (t !~ /^[ \t]/ && t !~ /^[ \t]*#[ \t]*define/) continue
            while (match(t, /(^|[^A-Za-z0-9_.>])nb_[A-Za-z0-9_]*[ \t]*\(/)) {
                name = substr(t, RSTART, RLENGTH); t = substr(t, RSTART + RLENGTH)
                sub(/^[^n]*/, "", name); sub(/[ \t]*\($/, "", name)
                if (!(name in def_room)) continue
                if (def_room[name] == room[file[i]] && !(file[i] == "ops/op.c" && def_file[name] != "ops/op.c" &&
                                                     def_file[name] != "ops/op.h")) continue
                print file[i] "|" lineno[i] "|" name "|" def_room[name] "|" def_file[name] "|" decl_rooms[name]
            }
        }
    }' $files)

# A public function may be called from any room that may call its room; an
# internal one (nb__*) only through a header the caller may include (its own
# room's or one it may include), which a room that may only call another's
# public functions (tape/ and ops/) may not.
while IFS='|' read -r f line name to def declared; do
    [ -n "$f" ] || continue
    from=$(room_of "$f")
    if [ "$from" = "$to" ]; then
        offend "$f:$line: the helpers every op shares call $name, an op ($def)"
        continue
    fi
    # shellcheck disable=SC2086
    if ! in_list "$to" ${may_call[$from]-}; then
        offend "$f:$line: $from calls $name, defined in $to ($def), which is not a room it may call"
        continue
    fi
    [[ $name == nb__* ]] || continue
    reachable=0
    # shellcheck disable=SC2086
    for r in $to $declared; do
        { [ "$r" = "$from" ] || in_list "$r" ${may_include[$from]-}; } && reachable=1
    done
    [ $reachable = 1 ] ||
        offend "$f:$line: $from calls $name, internal to $to ($def), whose headers it may not include"
done <<<"$calls"

exit $fail
