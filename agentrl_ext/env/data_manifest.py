"""The pinned benchmark data set: every file, its checksum, and the public source it comes from.

The checksums are those of the vendored copy (``SHA256SUMS`` of the data README's "SHA-256 of
every file"); the sources are the repositories and commits that README names. Files that no
single public file reproduces (the ALFWorld archive, assembled from two repositories; the two
WebShop files rebuilt from a search index) are *copy-only*: ``agentrl-data install --from`` gets
them, ``agentrl-data fetch`` says why it cannot. Files over the 4 MiB limit of the vendored copy
(the DBBench training set) are pinned by their git blob id and fetched only.
"""

from __future__ import annotations

from dataclasses import dataclass

AGENTBENCH = ("THUDM/AgentBench", "578c5e9f706fc2dd96188ca6c8cf9095ca0c6528")
WEBSHOP = ("princeton-nlp/WebShop", "64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd")
AGENTGYM = ("WooooDyy/AgentGym", "3ef9235d23e68e7c2920c5422ad957dc8ced5c6c")
ALFWORLD = ("alfworld/alfworld", "ca98194122f6759fdc11960e56f520d6175fd960")

# sha256, bytes, path: the vendored set (130 files), as in its SHA256SUMS.
_PINNED = """
0bdf8c0558499c192b6ab55818e99e91ef0eb02c6e2d19d907b3f2e14df40590     1082 LICENSES/ALFWorld-LICENSE.txt
c71d239df91726fc519c6eb72d318ec65820627232b2f796219e87dcf35d0ab4    11357 LICENSES/AgentBench-LICENSE.txt
8872dbf8660b00890b5e07ce1ea1f7a44fa7ae4e1857da56caba172b51dab3cb     1094 LICENSES/WebShop-LICENSE.md
20b8f28be96aa2c011edd5a43653c5ee8089d51442e42cc8f361ce9866cc6ce0     2644 agentbench/alfworld_lists/dev.json
e64e8c0002648c403e05adedc25be5ea8b9863924f32cc7611051bed1f386e46    17067 agentbench/alfworld_lists/logic/alfred.pddl
d955e6db384c68ac5797e881b795fd36d788e87a03547f9a87e48fbd7c5b361b    12154 agentbench/alfworld_lists/logic/alfred.twl2
679592b9e5c2ff26ebfe5b7556ef1b6c0ba60d1f0b172c7420b11c86d83b9bbf    14011 agentbench/alfworld_lists/new_std.json
4c576333113019a65fef8e0648031a54dd5f75165686e7f3d4e3cfe98e0781df     6391 agentbench/alfworld_lists/standard.json
504c5725346d7588b1b1a5afe4b1a18c2d5cf5f9520a212c9fd45cc6c42f5bf8   373390 agentbench/alfworld_lists/train_valid.json
0736b72bbf407fc074429b4b014b3301be2197ac254afd12fec0fa8c673f2897      919 agentbench/configs/tasks/alfworld.yaml
83d9e26168ab306f16410ab83f3ac2937f6e685a0d9905b36799034ab8480d2a     1478 agentbench/configs/tasks/dbbench.yaml
3eb6186954d95cd1ece8f46ba89df8f7e7f06c2329e6f46c5a54874159a00326      938 agentbench/configs/tasks/kg.yaml
dba419de403e525a518d4e21e206647c46dbd9c6b6ef91d996f109fb64dde84e     3278 agentbench/configs/tasks/os.yaml
1f16a1fe3a91875ae746068d9b2c386fbc2342e9b021578e200b09fce72c8db9     1113 agentbench/configs/tasks/webshop.yaml
eb941c58a7a5651357b19e46aa05070f6cd5a7d83ce70cefd24aa3581e1e1130   188018 agentbench/dbbench/dev.jsonl
cf8dec6fb8051f46e6171136824aaa8b8707c3affbb3185c0bad2b39bc6b71e2   910356 agentbench/dbbench/standard.jsonl
5e28f8504ef98c513fa90090fc9543dbad54990723cc28854e2ba3ce1536d994    24729 agentbench/knowledgegraph/dev.json
54a1d671f7669898ddc195638efccdd96f3c3baf2fc644d88bcabd31a0d885f4  1883664 agentbench/knowledgegraph/kg_rl_all.json
1265d4e35602b126d2bd947fcb1c17722e08ff5076c5282508e3530ede18109c   225896 agentbench/knowledgegraph/std.json
e52d47b06201d9cad170f446429cc384541a5344fbed1cf478d99cd357508040     5462 agentbench/os_interaction/data/1/stock.json
4aea8438c25429144b856acb2159aab16d773519f29890dab156f04f38fdf2d5     3181 agentbench/os_interaction/data/2/environment.json
bc80aa92e75142b18b8c8158a2e059a45f158b303bea7249eaec1d0325e81b81     2979 agentbench/os_interaction/data/3/ac.json
fd288d038814c5ded8943763f96e001a3e36d5d3c7e7cca52dcd64ffe7f7241a      628 agentbench/os_interaction/data/4/N11.json
36e92aeb36140d2c751558d7a63fc8e6275574e213789465fabbcffad64e94a2      589 agentbench/os_interaction/data/4/N225.json
7372923d614b249e560311c1e61b1ab12afa1d5cbd955e77465d6abd74e9ddaf      417 agentbench/os_interaction/data/4/N37.json
9a81d1f035de9de4a1495abcc85f7cede6f2c53783162f280ea98c76869f4393      381 agentbench/os_interaction/data/4/N4.json
eb179d6da5e905031a2fe3f2709ee5c3673f8066f484ba4d8e69952891ab165e     2155 agentbench/os_interaction/data/4/N41.json
757d5be008acc9eaedb664b053f324ab7d80da985453f3cf9921b18c61c7da94      703 agentbench/os_interaction/data/4/Q09.json
c80d9180a794f7c574cce319b23b335329e03caa553b51449cbda832589a932b      575 agentbench/os_interaction/data/4/Q19.json
d63aae719a83d31b7d632848930ab8b8cba3cd0582b579cfdb7f0b579958bb0e     4523 agentbench/os_interaction/data/4/Q30.json
b79657df4e238eaa0c6d26f27649deef70207123291a5206edf3f0b98eb7856c     1419 agentbench/os_interaction/data/4/Q47.json
a5c32d5e0da858077913d7e5006f2d32ad1ea1aa69cc5b9f21ad1d74082e5114      948 agentbench/os_interaction/data/4/Q49.json
735d0c0b3aa8fd1bef0d969470a2ac44c0af92542365c05c5f89ce3ddb47801e     7076 agentbench/os_interaction/data/5/new.json
1c31a016c379bf7d86fcfa926653c94380907aae881d64863f9af439cfd99ed8     5775 agentbench/os_interaction/data/6-backup.json
0c3234d860953ece19bf07e1f89c1d18048b1c7095f419c6d1eeaec64f7bf433     6091 agentbench/os_interaction/data/6/new.json
574627bffe5b01c8aaccbde631618b3c8b8fb1e4ec6de06a102e7ee2dec9b7db   160447 agentbench/os_interaction/data/7/bootstrap.json
c5554248e6c1cb606e27d2f81025b751a490c9a5ccd37aabf4c86879a52e9274    16209 agentbench/os_interaction/data/dev.json
c50a7ca80c4602b90b0eaa48c7a962f092eae83d22f4bb0dc53fbe6792522bd6      270 agentbench/os_interaction/res/dockerfiles/default
65a5134b279ca6a42e2187441f86bd68081422704aa032edc815b21e78862b0a      292 agentbench/os_interaction/res/dockerfiles/packages
ca9004d973c811a28b02b88cec221c17f604403abfc443e7be6f3b3a0b6ff6f4       65 agentbench/os_interaction/res/dockerfiles/ubuntu
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/1/check/1.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/1/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/1/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/1/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/1/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/1/check/string-match.py
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/1/example/1.sh
f56602a5d3fffebdf1237b73525db68d7ebbd333e82534e78214de2c169bbd5e      296 agentbench/os_interaction/scripts/1/init/gen_words.sh
2fc0f9703911f89499d45cf3043378584952d7a07521183237639082c5b197cf       81 agentbench/os_interaction/scripts/1/init/install_nettools.sh
541a2a42507855a5b9b2f01a6ef3d17345a5d27e53233276ecb5be495d7705f2      469 agentbench/os_interaction/scripts/1/init/nested_folders.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/1/init/stock-log.sh
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/2/check/1.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/2/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/2/check/in.py
9717a8a15f466f93ef02606257fe3ab3bb0c0ed1d1804783d8d393d16b6ad533       92 agentbench/os_interaction/scripts/2/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/2/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/2/check/string-match.py
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/2/example/1.sh
f56602a5d3fffebdf1237b73525db68d7ebbd333e82534e78214de2c169bbd5e      296 agentbench/os_interaction/scripts/2/init/gen_words.sh
2fc0f9703911f89499d45cf3043378584952d7a07521183237639082c5b197cf       81 agentbench/os_interaction/scripts/2/init/install_nettools.sh
541a2a42507855a5b9b2f01a6ef3d17345a5d27e53233276ecb5be495d7705f2      469 agentbench/os_interaction/scripts/2/init/nested_folders.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/2/init/stock-log.sh
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/3/check/1.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/3/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/3/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/3/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/3/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/3/check/string-match.py
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/3/example/1.sh
f56602a5d3fffebdf1237b73525db68d7ebbd333e82534e78214de2c169bbd5e      296 agentbench/os_interaction/scripts/3/init/gen_words.sh
2fc0f9703911f89499d45cf3043378584952d7a07521183237639082c5b197cf       81 agentbench/os_interaction/scripts/3/init/install_nettools.sh
541a2a42507855a5b9b2f01a6ef3d17345a5d27e53233276ecb5be495d7705f2      469 agentbench/os_interaction/scripts/3/init/nested_folders.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/3/init/stock-log.sh
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/4/check/1.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/4/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/4/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/4/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/4/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/4/check/string-match.py
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/4/example/1.sh
f56602a5d3fffebdf1237b73525db68d7ebbd333e82534e78214de2c169bbd5e      296 agentbench/os_interaction/scripts/4/init/gen_words.sh
2fc0f9703911f89499d45cf3043378584952d7a07521183237639082c5b197cf       81 agentbench/os_interaction/scripts/4/init/install_nettools.sh
541a2a42507855a5b9b2f01a6ef3d17345a5d27e53233276ecb5be495d7705f2      469 agentbench/os_interaction/scripts/4/init/nested_folders.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/4/init/stock-log.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/5/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/5/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/5/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/5/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/5/check/string-match.py
8ddd84de17464a4b6a37e96f5d6ac937ce1dd5c5196eed78bd5a55487d5b67d1     1943 agentbench/os_interaction/scripts/5/checking/0.sh
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/5/checking/1.sh
1c06c3f29f90b9dd728faf14540bd9602f077af6777baf2c1fe13ae0b5e23285      386 agentbench/os_interaction/scripts/5/checking/2.sh
23970a83ef56b0b17071f3408f5ac5e81fd9108df800ca2d33144c203eabd332       98 agentbench/os_interaction/scripts/5/example/0.sh
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/5/example/1.sh
d21b7deca845f6d815ae7bf6656952a4082046dab0a8c856f9e89d0bce396e86      106 agentbench/os_interaction/scripts/5/example/2.sh
4dec0d0ffb31efc29123d16f09db6c1adffeb0f9d5c791af0acc82e6397f5d63     7377 agentbench/os_interaction/scripts/5/file.json
e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855        0 agentbench/os_interaction/scripts/5/init/1.sh
a7a0d6d37ebf6f95e1afc95d1f864fef9dd0d90499976602dc7bde77a348bf26     7220 agentbench/os_interaction/scripts/5/new.json
002417c87176194e23f417d3e8976d281bdaffb08a9bdcd55d3503784322853d     2878 agentbench/os_interaction/scripts/5/prompt.md
774b10b0cf309b6f5b6cb6cf0d1f6f9b1fc4f005df49edef14de291037e29b13  1379677 agentbench/os_interaction/scripts/6/collected.json
7000869f64649dfc6bdcb0614e04dfe735e4f0c3f8c89e1d31e3707c1b4a3d40     6742 agentbench/os_interaction/scripts/6/new.json
4054ebec780b868f622d3913895504605cf3b49bfb09e55820eeeec7c1e89b16     8925 agentbench/os_interaction/scripts/6/permission.json
65ee4f3754ec893af569af2a8d97c232e2952cb884238b3dbf94e34e4001835c      785 agentbench/os_interaction/scripts/7/check/1.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/7/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/7/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/7/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/7/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/7/check/string-match.py
099440ccb493c66235ed6ddbfd81d83bfb56240bb1f88ebe4b775582e53dc9f3      455 agentbench/os_interaction/scripts/7/example/1.sh
f56602a5d3fffebdf1237b73525db68d7ebbd333e82534e78214de2c169bbd5e      296 agentbench/os_interaction/scripts/7/init/gen_words.sh
2fc0f9703911f89499d45cf3043378584952d7a07521183237639082c5b197cf       81 agentbench/os_interaction/scripts/7/init/install_nettools.sh
541a2a42507855a5b9b2f01a6ef3d17345a5d27e53233276ecb5be495d7705f2      469 agentbench/os_interaction/scripts/7/init/nested_folders.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/7/init/stock-log.sh
bc75b2778c644ec42abb46abec6eadf52812f10c02255a1c3b2b55c3ced0ae0c     1115 agentbench/os_interaction/scripts/dev/check/0.sh
107c1f4a4065702276084876fca4316d3d4de14b24c3e7d89cb7e532e0794c31      206 agentbench/os_interaction/scripts/dev/check/containing.py
35325fb698f3c8d2009c70466237f2d0a98df20bf8e19558d7677beefa8e54b8      206 agentbench/os_interaction/scripts/dev/check/in.py
1f1fd1b34581794346c577bea54d50c87a547f483e552259cb66563c25f5fed8       69 agentbench/os_interaction/scripts/dev/check/integer-match.py
b0d6ed977b4802f01725edd90c96f056021a75fe09ebf890a1a3a01dfc934b29      694 agentbench/os_interaction/scripts/dev/check/size-match.py
c0afd9384f5c2e492b5c158731e5fefb000692c4ba6a6be89f168aca7e89faec      181 agentbench/os_interaction/scripts/dev/check/string-match.py
23970a83ef56b0b17071f3408f5ac5e81fd9108df800ca2d33144c203eabd332       98 agentbench/os_interaction/scripts/dev/example/0.sh
2fc591294f8db0333a95bb382f7e83776ccc6143cca122acc201e8d4222da9fc      473 agentbench/os_interaction/scripts/dev/init/stock-log.sh
35cbd6cc07646eab32161d64260bbcc4d0cab145a7caae69c236320a9d7c7685  1664159 agentbench/os_interaction/train_0317/training.json
67af9641ff7895b550e1bd00bddb54316d3a2fa2210b01925c34a2a8d6ea50d7   920597 alfworld/json_2.1.1.manifest.tsv
60f9cbc353b1022a3346d641e55379a8d554f82f94b5396e919ab550635e0a59  3363376 alfworld/json_2.1.1.tar.xz
eeab2f1c55f1727e1abc998990070b2a4a2628fe79ffadb044e369fbc24c0303    49035 alfworld/train_valid.missing.txt
5b77264a9ed6cb1dae7d142981c9cf3bb8b14055bc0138b431788c7734467a54    46076 webshop/goal_query_map.json.xz
72fb1ceba02df6725372b49f027819489bc5f6977394f16127711a6817961e7f   207444 webshop/human_goals.json.xz
7e496008be2d3081f68840fbeb2357fb3aaea1c54618e731326fdb24efa5eb33     1944 webshop/items_human_ins.subset1000.json.xz
e74e145f41c18d7c0384d7d8a0bab6d7dd5ec73869fca36edab00a4ba6397323    22236 webshop/items_ins_v2_1000.json.xz
2ba303e408ee0060dd173b9db4fe2d06234f1cad26d809db0b8e6f1fa63445f6   565588 webshop/items_shuffle_1000.reconstructed.json.xz
"""

# Where the vendored directories come from in AgentBench (data dir prefix -> upstream prefix).
_AGENTBENCH_PREFIXES = {
    "agentbench/dbbench/": "data/dbbench/",
    "agentbench/os_interaction/": "data/os_interaction/",
    "agentbench/knowledgegraph/": "data/knowledgegraph/",
    "agentbench/alfworld_lists/": "data/alfworld/",
    "agentbench/configs/tasks/": "configs/tasks/",
}
# path -> (repository, commit, upstream path, stored xz-compressed, sha256 of the upstream content)
_SINGLE_SOURCES = {
    "LICENSES/AgentBench-LICENSE.txt": (*AGENTBENCH, "LICENSE", False, None),
    "LICENSES/WebShop-LICENSE.md": (*WEBSHOP, "LICENSE.md", False, None),
    "LICENSES/ALFWorld-LICENSE.txt": (*ALFWORLD, "LICENSE", False, None),
    "webshop/human_goals.json.xz": (
        *WEBSHOP,
        "baseline_models/data/human_goals.json",
        True,
        "b68746ed66cd31fdc5f70eb3f5831a46b38163563b57a66ddcab8fd60ee0cbdc",
    ),
    "webshop/goal_query_map.json.xz": (
        *WEBSHOP,
        "baseline_models/data/goal_query_map.json",
        True,
        "1524f438ffbc51c7e308e635d7d9e14fa696b08f5d4300922d454ef0105cea86",
    ),
    "webshop/items_ins_v2_1000.json.xz": (
        *AGENTGYM,
        "agentenv-webshop/webshop/data/items_ins_v2_1000.json",
        True,
        "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
    ),
}
_COPY_ONLY = {
    "alfworld/": "assembled from per-file sources in two repositories (listed in alfworld/json_2.1.1.manifest.tsv)",
    "webshop/items_shuffle_1000.reconstructed.json.xz": "reconstructed from a Lucene index (data README §3)",
    "webshop/items_human_ins.subset1000.json.xz": "reconstructed from a Lucene index (data README §3)",
}
# Not in the vendored copy (over its 4 MiB limit): fetched and pinned by git blob id.
_LARGE = {
    "agentbench/dbbench/db_out_new.jsonl": (
        "data/dbbench/db_out_new.jsonl",
        "288c59103a9c05e01f33b67f3007a69cebc75955",
    ),
    "agentbench/dbbench/extend_std.json": (
        "data/dbbench/extend_std.json",
        "8daa69d26a04ac769fc748b24da1fb187bf429f1",
    ),
}


@dataclass(frozen=True)
class Source:
    """A file in a public GitHub repository at a pinned commit."""

    repo: str
    commit: str
    path: str

    def url(self, raw_base: str) -> str:
        """The download URL under ``raw_base`` (``https://raw.githubusercontent.com`` or a mirror)."""
        return f"{raw_base.rstrip('/')}/{self.repo}/{self.commit}/{self.path}"


@dataclass(frozen=True)
class DataFile:
    """One file of the data directory.

    ``sha256``/``size`` are those of the file as installed (None for files pinned by git blob
    only). ``source`` is where ``fetch`` downloads it; ``compress_xz`` means the download is the
    raw upstream file, stored xz-compressed, and verified by ``content_sha256`` (the upstream
    file's sha256) or ``git_blob`` (its git blob id). ``copy_only`` says why there is no source.
    """

    path: str
    group: str
    sha256: str | None = None
    size: int | None = None
    source: Source | None = None
    compress_xz: bool = False
    content_sha256: str | None = None
    git_blob: str | None = None
    copy_only: str | None = None
    vendored: bool = True
    """Part of the vendored copy (its SHA256SUMS lists it)."""


def _group(path: str) -> str:
    if path.startswith("LICENSES/"):
        return "licenses"
    return path.split("/", 1)[0]


def _vendored_file(sha256: str, size: int, path: str) -> DataFile:
    if path in _SINGLE_SOURCES:
        repo, commit, upstream, xz, content = _SINGLE_SOURCES[path]
        source = Source(repo, commit, upstream)
        return DataFile(path, _group(path), sha256, size, source, xz, content)
    for prefix, upstream in _AGENTBENCH_PREFIXES.items():
        if path.startswith(prefix):
            source = Source(*AGENTBENCH, upstream + path[len(prefix) :])
            return DataFile(path, _group(path), sha256, size, source)
    for prefix, why in _COPY_ONLY.items():
        if path == prefix or (prefix.endswith("/") and path.startswith(prefix)):
            return DataFile(path, _group(path), sha256, size, copy_only=why)
    raise AssertionError(f"pinned file {path!r} has no source and no copy-only reason")


def _build() -> dict[str, DataFile]:
    files: dict[str, DataFile] = {}
    for line in _PINNED.strip().splitlines():
        sha256, size, path = line.split(maxsplit=2)
        files[path] = _vendored_file(sha256, int(size), path)
    for path, (upstream, blob) in _LARGE.items():
        files[path] = DataFile(
            path, "agentbench-large", source=Source(*AGENTBENCH, upstream), git_blob=blob, vendored=False
        )
    return files


FILES: dict[str, DataFile] = _build()
"""Every known data file by its path in the data directory."""
ARCHIVES: dict[str, str] = {"alfworld/json_2.1.1.tar.xz": "alfworld/json_2.1.1"}
"""Archives unpacked in the data directory: archive path -> the folder it unpacks to (both relative)."""
GROUPS: tuple[str, ...] = tuple(sorted({f.group for f in FILES.values()}))
"""File groups: ``agentbench``, ``agentbench-large``, ``alfworld``, ``licenses``, ``webshop``."""
