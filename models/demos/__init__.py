# SPDX-License-Identifier: Apache-2.0
"""End-to-end demos on real models."""
