# SPDX-License-Identifier: Apache-2.0
"""One warm weight cache for a fleet: variants pushed to a shared store and pulled on other hosts.

Modules, from the bottom up (none imports torch or ttnn):

``store_layout``  every key of a shared store; the manifest's format, checked as untrusted input
``stores``        the store interface and its errors; the directory backend (``push --to DIR``) and
                  the HTTP mirror
``s3``            the S3 backend (boto3): endpoint override, multipart, conditional writes
``urls``          which store a URL names
``transfer``      moving one object: verified uploads and the download strategies
``store_gc``      evict a store's least recently used variants, then the objects no manifest names
``push``          send a variant's missing objects, then its manifest
``pull``          fetch a variant into a new local generation through the one build transaction
``after_build``   a committed cold build pushes its variant (``$TT_CACHE_REMOTE_PUSH``); what a
                  process's loads pulled and pushed, for a caller that reports it (the seed worker)
``cold_start``    a loader's cold start pulls its exact variant first (``$TT_CACHE_REMOTE``)
"""
