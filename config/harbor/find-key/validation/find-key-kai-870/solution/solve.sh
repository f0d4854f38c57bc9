#!/bin/sh
ans "$(cat kai)"
