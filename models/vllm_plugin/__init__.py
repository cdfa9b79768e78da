# SPDX-License-Identifier: Apache-2.0
"""vLLM plugin: placeholder."""
