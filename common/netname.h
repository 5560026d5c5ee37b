/* Backbone names: which networks pfcps builds, as the config checks them (before a run forms) and as
 * worker/model/zoo.c builds them. One grammar, here at the bottom so that both arrows point down:
 *   r18 r34 r50 r100 r200 (iresnet depths; "iresnetN" is the same as "rN"), each optionally with a width
 *   suffix _wW (W even, 2..512: stage widths W, 2W, 4W, 8W instead of 64..512), and mbf / mobilefacenet. */
#ifndef PFCPS_COMMON_NETNAME_H
#define PFCPS_COMMON_NETNAME_H

typedef enum { PF_NET_IRESNET = 1, PF_NET_MBF = 2 } pf_net_kind;

typedef struct pf_network_name {
    pf_net_kind kind;
    char name[32];  /* canonical: "iresnet50" -> "r50", "r18_w16", "mbf" */
    char depth[32]; /* iresnet: "r18" .. "r200" */
    int width;      /* iresnet: first stage width (64 without a suffix) */
} pf_network_name;

/* Parses `network` into *out. Returns 0, or -EINVAL with the message "unknown network '...' (known: ...)" or
 * "network '...': width suffix _w... is not an even number in [2, 512]". */
int pf_network_parse(const char *network, pf_network_name *out);

#endif
