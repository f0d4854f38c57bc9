#!/bin/sh
ans "$(cat kba)"
