"""Firmware codegen: kernel registration, selective-build list, model header, CMake (Jinja2)."""

from etforge.codegen.generate import CodegenResult, generate

__all__ = ["CodegenResult", "generate"]
