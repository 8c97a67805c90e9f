/* config_internal.h - shared between config.c and config_switch.c only. */
#ifndef DRAMA_MODEL_CONFIG_INTERNAL_H
#define DRAMA_MODEL_CONFIG_INTERNAL_H

#include "model/config.h"

drama_status dr_switches_init(dr_config *c, drama_error *err);
drama_status dr_switches_apply_object(dr_config *c, const json_t *obj, dr_switch_source src, const char *where,
                                      drama_error *err);
drama_status dr_switches_apply_set(dr_config *c, const char *set, drama_error *err);
drama_status dr_switches_fill(dr_config *c, drama_error *err);
void dr_switches_free(dr_config *c);

#endif
