#!/bin/sh
ans "$(cat kbd)"
