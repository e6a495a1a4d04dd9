#!/usr/bin/env bash
# Print a manifest of deploy/k8s/ with the GPU node's render group id filled in, for `kubectl apply -f -`:
#   RENDER_GID=$(stat -c %g /dev/kfd) deploy/k8s/render.sh deploy/k8s/pytorchjob.yaml | kubectl apply -f -
# (read RENDER_GID on a GPU node: `stat -c %g /dev/kfd`, or `getent group render | cut -d: -f3`). The manifests
# carry the placeholder ${RENDER_GID} in supplementalGroups because the render group's id is assigned per host
# (a dynamic system group: 109 on one Ubuntu host, 992 or 993 on others); a wrong one leaves /dev/kfd and
# /dev/dri/renderD* (root:render, 0660) closed to the non-root pod, and rocmft's gpu-devices check fails.
# Applied unrendered, the placeholder is a string where Kubernetes wants an integer: the API server refuses it.
# Only ${RENDER_GID} is replaced (any other $ stays as written). Exit 2, with nothing printed on stdout, when
# RENDER_GID is unset or not a group id, or the file is unreadable or has no placeholder.
set -euo pipefail

usage="usage: RENDER_GID=<the GPU node's render gid> $0 MANIFEST.yaml (read it on the node: stat -c %g /dev/kfd)"
die() {
  echo "[rocmft.k8s] $*" >&2
  exit 2
}

(($# == 1)) || die "$usage"
manifest=$1
[[ -r $manifest && -f $manifest ]] || die "$manifest: no such readable file. $usage"
gid=${RENDER_GID-}
[[ -n $gid ]] || die "RENDER_GID is not set: give the GPU node's render group id. $usage"
# the API server takes a group id from 0 to 2^31 - 1 (kubernetes/kubernetes staging/src/k8s.io/apimachinery/pkg/
# util/validation/validation.go, IsValidGroupID: maxGroupID = math.MaxInt32)
if ! [[ $gid =~ ^(0|[1-9][0-9]{0,9})$ ]] || ((gid > 2147483647)); then
  die "RENDER_GID=$gid is not a group id Kubernetes accepts (a number from 0 to 2147483647). $usage"
fi
text=$(<"$manifest")
# shellcheck disable=SC2016 # the literal placeholder, not an expansion
placeholder='${RENDER_GID}'
[[ $text == *"$placeholder"* ]] || die "$manifest has no $placeholder placeholder: nothing to fill in"
printf '%s\n' "${text//"$placeholder"/$gid}"
