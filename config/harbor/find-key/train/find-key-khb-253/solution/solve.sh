#!/bin/sh
ans "$(cat khb)"
